package claim

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/fakeclock"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/mongo/mongotest"
)

// handOverStore is the real store, with the claim's partitions handed to
// another worker right after its read (once).
type handOverStore struct {
	*mongo.Store
	once  sync.Once
	after func()
}

func (s *handOverStore) ReadClaimable(ctx context.Context, now time.Time, limit events.ClaimLimit) ([]bson.Raw, bool, error) {
	docs, more, err := s.Store.ReadClaimable(ctx, now, limit)
	s.once.Do(s.after)
	return docs, more, err
}

// TestParksOnlyWhileHeld a claim whose partitions
// change hands after its read parks nothing in them. Its parks are
// written under the claimer's hold, and only in the partitions still held
// under the tenure it read with: a park written after the give-back could
// land after the new owner read which aggregates have parked events, and
// the new owner would then take a later event of such an aggregate before
// the parked one. Before: the read parked as it went, whoever held the
// partitions by then ("3 events parked by a claim that lost its
// partitions").
func TestParksOnlyWhileHeld(t *testing.T) {
	t.Parallel()
	store := mongotest.Store(t)
	coll := store.Collection()
	if _, err := store.Pause(t.Context(), events.Pause{Type: "bulk.import", By: "test"}); err != nil {
		t.Fatal(err)
	}
	insertEvents(t, coll, 3, "bulk.import")
	clock := fakeclock.New(time.Now())
	ownerA, ownerB := newOwner(t, store, clock, "worker-a"), newOwner(t, store, clock, "worker-b")
	settleOwnership(t, clock, ownerA)
	handOver := &handOverStore{Store: store, after: func() {
		clock.Advance(testTerm + testTerm/5)
		settleOwnership(t, clock, ownerB)
	}}
	cA, _ := newClaimer(t, handOver, idlePublisher{t}, Config{WorkerID: "worker-a", Owner: ownerA})
	runOnce(t, cA)
	n, err := coll.CountDocuments(t.Context(), bson.D{{Key: events.FieldParked, Value: true}})
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d events parked by a claim that lost its partitions, want 0", n)
	}
	// The new owner parks them itself, and knows it.
	cB, _ := newClaimer(t, store, idlePublisher{t}, Config{WorkerID: "worker-b", Owner: ownerB})
	runOnce(t, cB)
	if n, err = coll.CountDocuments(t.Context(), bson.D{{Key: events.FieldParked, Value: true}}); err != nil || n != 3 {
		t.Errorf("the new owner parked %d events (%v), want 3", n, err)
	}
}
