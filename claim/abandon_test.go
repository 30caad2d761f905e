package claim

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/fakeclock"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
)

// failingClaimStore lets the claim's write land, then reports it failed,
// as a claim cut off by a timeout after the server applied its update.
type failingClaimStore struct {
	*mongo.Store
	fail atomic.Bool
}

func (s *failingClaimStore) ClaimRead(ctx context.Context, lease events.Lease, docs []bson.Raw, limit events.ClaimLimit) (events.ClaimResult, error) {
	res, err := s.Store.ClaimRead(ctx, lease, docs, limit)
	if s.fail.Load() {
		return events.ClaimResult{}, errors.New("client timed out waiting for server response")
	}
	return res, err
}

// A claim that fails after the server claimed events for it leaves them
// neither PROCESSING until recovery nor an attempt poorer: they go back to
// NEW at once, and once a release after that finds nothing more (the
// failed write is over), the next run relays them.
func TestFailedClaimReleasesWhatItTook(t *testing.T) {
	t.Parallel()
	r := newRelayRig(t)
	store := &failingClaimStore{Store: r.store}
	clock := fakeclock.New(time.Now())
	c, _ := newClaimer(t, store, newPublisher(t, r.exchange), Config{BatchSize: 50, Now: clock.Now})
	ids := insertEvents(t, r.coll, 20, "order.created")

	store.fail.Store(true)
	if _, err := c.runOnce(t.Context()); err == nil {
		t.Fatal("runOnce with a failing claim returned no error")
	}
	for id, d := range allEvents(t, r.coll) {
		if d.Status != events.StatusNew || d.Attempts != 0 || d.ClaimToken != "" {
			t.Errorf("event %s after the failed claim: status %s, attempts %d, token %q; want NEW, 0, none",
				id, d.Status, d.Attempts, d.ClaimToken)
		}
	}

	store.fail.Store(false)
	clock.Advance(abandonSettle)
	runOnce(t, c) // the second release finds nothing: the aggregates are free
	runOnce(t, c)
	testenv.Receive(t, r.deliveries, ids, waitFor)
}
