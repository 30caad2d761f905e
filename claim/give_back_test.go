package claim

// Order without transactions across a give-back, against the real store:
// a claim write of the old owner that ended without an answer may still
// land after the partition is given back.

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/fakeclock"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/mongo/mongotest"
	"github.com/outboxrelay/outbox/ownership"
	"github.com/outboxrelay/outbox/service"
)

// insertAggregate inserts n NEW events of one aggregate, a millisecond
// apart, and returns their ids oldest first and the aggregate's partition.
func insertAggregate(t *testing.T, coll *driver.Collection, id string, n int) ([]string, int) {
	t.Helper()
	start := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	ids := make([]string, n)
	docs := make([]any, n)
	for i := range n {
		oid := bson.NewObjectID()
		d := events.Draft{ID: oid, Type: "order.updated", AggregateType: "order", AggregateID: id, Payload: bson.D{{Key: "n", Value: i}}}
		doc, err := d.Document(start.Add(time.Duration(i) * time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		ids[i], docs[i] = oid.Hex(), doc
	}
	if _, err := coll.InsertMany(t.Context(), docs); err != nil {
		t.Fatal(err)
	}
	return ids, events.PartitionOf("order\x00" + id)
}

// doubtfulStore is the store with a claim write that ends without an
// answer while it is set: nothing is written yet, and land applies it
// later, as a server that carried on with a write its client gave up on.
type doubtfulStore struct {
	*mongo.Store
	doubt atomic.Bool
	late  func(ctx context.Context) (events.ClaimResult, error)
}

func (s *doubtfulStore) ClaimRead(ctx context.Context, lease events.Lease, docs []bson.Raw, limit events.ClaimLimit) (events.ClaimResult, error) {
	if !s.doubt.Load() {
		return s.Store.ClaimRead(ctx, lease, docs, limit)
	}
	s.late = func(ctx context.Context) (events.ClaimResult, error) {
		return s.Store.ClaimRead(ctx, lease, docs, limit)
	}
	return events.ClaimResult{}, fmt.Errorf("claim %d events: %w", len(docs), context.DeadlineExceeded)
}

// heldBy returns the events of ids lease l holds.
func heldBy(t *testing.T, coll *driver.Collection, l events.Lease, ids []string) []string {
	t.Helper()
	var out []string
	all := allEvents(t, coll)
	for _, id := range ids {
		if e := all[id]; e.Status == events.StatusProcessing && e.ClaimToken == l.Token {
			out = append(out, id)
		}
	}
	return out
}

// A give-back with a write in doubt: a's claim write of x1 ends without
// an answer; a's broker goes away and a gives its partitions back; b takes
// them and reads x1 and x2 NEW; a's write lands and takes x1; b's write
// wins x2 alone, and b would publish x2 before x1. The give-back must not
// free x1's partition while a's write may land: b claims nothing of the
// aggregate until a's term has run out, and then finds x1 PROCESSING.
func TestGiveBackWithAWriteInDoubtKeepsTheOrder(t *testing.T) {
	t.Parallel()
	store := &doubtfulStore{Store: mongotest.Store(t)}
	coll := store.Collection()
	ids, p := insertAggregate(t, coll, "give-back", 2)
	clock := fakeclock.New(time.Now())
	var brokerDown atomic.Bool
	ownerA, err := ownership.New(store.Owners(), ownership.Config{WorkerID: "worker-a", TermLength: testTerm,
		Archetype: service.Archetype{Now: clock.Now, Local: clock.Now, Logger: discard},
		Ready: func() error {
			if brokerDown.Load() {
				return events.ErrUnavailable
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	ownerB := newOwner(t, store.Store, clock, "worker-b")
	settleOwnership(t, clock, ownerA)

	// a claims x1 (a batch of one); its write ends without an answer.
	cA, _ := newClaimer(t, store, idlePublisher{t}, Config{WorkerID: "worker-a", Owner: ownerA, BatchSize: 1,
		Archetype: service.Archetype{Now: clock.Now, Local: clock.Now}})
	store.doubt.Store(true)
	if _, err := cA.runOnce(t.Context()); err == nil {
		t.Fatal("a's claim with a write in doubt returned no error")
	}
	if store.late == nil {
		t.Fatal("a's claim wrote nothing: the test does not test the case")
	}
	// a's broker goes away: its round gives everything back.
	brokerDown.Store(true)
	if err := ownerA.Tick(t.Context()); err != nil {
		t.Fatalf("a's Tick: %v", err)
	}

	// b takes what is free and reads in it; a's write lands; b writes.
	claimB := func(lease events.Lease) []string {
		t.Helper()
		terms, _, done := ownerB.Hold()
		defer done()
		limit := events.ClaimLimit{Events: 10, Owned: sameTerms(terms, terms), Tenures: terms, Ordered: true, FailedHolds: true}
		docs, _, err := store.ReadClaimable(t.Context(), clock.Now(), limit)
		if err != nil {
			t.Fatalf("b's read: %v", err)
		}
		if store.late != nil {
			if _, err := store.late(t.Context()); err != nil {
				t.Fatalf("a's late write: %v", err)
			}
			store.late = nil
		}
		if _, err := store.Store.ClaimRead(t.Context(), lease, docs, limit); err != nil {
			t.Fatalf("b's write: %v", err)
		}
		return heldBy(t, coll, lease, ids)
	}
	if err := ownerB.Tick(t.Context()); err != nil {
		t.Fatalf("b's Tick: %v", err)
	}
	b := fenceLease("worker-b", "token-b", clock.Now())
	if got := claimB(b); len(got) > 0 {
		t.Errorf("b claimed %v (x1 %s, x2 %s) while a's write of x1 could still land in partition %d", got, ids[0], ids[1], p)
	}
	if e := allEvents(t, coll)[ids[0]]; e.Status != events.StatusProcessing || e.WorkerID != "worker-a" {
		t.Fatalf("x1 after a's late write: %s by %q, want PROCESSING by worker-a", e.Status, e.WorkerID)
	}
	// a's term runs out, a margin later b takes the partition: x1 is
	// PROCESSING, so its aggregate is held, x2 with it.
	clock.Advance(testTerm + testTerm/5)
	if err := ownerB.Tick(t.Context()); err != nil {
		t.Fatalf("b's Tick: %v", err)
	}
	if !slices.Contains(ownerB.Owned(), p) {
		t.Fatalf("b does not own partition %d after a's term ran out", p)
	}
	b2 := fenceLease("worker-b", "token-b2", clock.Now())
	if got := claimB(b2); len(got) > 0 {
		t.Errorf("b claimed %v while x1 (%s) is PROCESSING under a's late write", got, ids[0])
	}
}
