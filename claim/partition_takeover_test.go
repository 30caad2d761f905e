package claim

// Per-aggregate order and work sharing against the real store and broker:
// several in-process claimers, each with its own publisher and its own
// ownership manager, on one outbox.

import (
	"testing"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/fakeclock"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/mongo/mongotest"
	"github.com/outboxrelay/outbox/ownership"
	"github.com/outboxrelay/outbox/service"
)

const testTerm = 30 * time.Second

// newOwner returns the ownership manager of worker id, whose clock (server
// and local alike) the test moves by hand, so that terms expire when it
// says.
func newOwner(t *testing.T, store *mongo.Store, clock *fakeclock.Clock, id string) *ownership.Manager {
	t.Helper()
	m, err := ownership.New(store.Owners(), ownership.Config{WorkerID: id, TermLength: testTerm,
		Archetype: service.Archetype{Now: clock.Now, Local: clock.Now, Logger: discard}})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// settleOwnership runs ownership rounds, the clock moving past the margin
// between them, until every partition has an owner and the managers hold
// about equal shares.
func settleOwnership(t *testing.T, clock *fakeclock.Clock, ms ...*ownership.Manager) {
	t.Helper()
	for range 8 {
		balanced := true
		owned := map[int]bool{}
		for _, m := range ms {
			if err := m.Tick(t.Context()); err != nil {
				t.Fatalf("Tick: %v", err)
			}
		}
		for _, m := range ms {
			if len(m.Owned()) < ownership.Share(len(ms))-len(ms)+1 {
				balanced = false
			}
			for _, p := range m.Owned() {
				if owned[p] {
					t.Fatalf("partition %d owned twice", p)
				}
				owned[p] = true
			}
		}
		if len(owned) == events.Partitions && balanced {
			return
		}
		clock.Advance(testTerm / 8)
	}
	t.Fatal("ownership did not settle in 8 rounds")
}

// TestFencingOldOwnerClaimsNothing is the interleaving of a paused owner:
// a owns every partition and claims a batch; a pauses past its term;
// recovery takes the batch back; b takes the partitions and claims the
// events again; a, awake, claims nothing, loses its renewals, and its late
// writes for the batch it held change nothing.
func TestFencingOldOwnerClaimsNothing(t *testing.T) {
	t.Parallel()
	store := mongotest.Store(t)
	coll := store.Collection()
	ids := insertEvents(t, coll, 10, "order.created")
	extra := insertEvents(t, coll, 5, "order.updated") // still NEW when a wakes up
	clock := fakeclock.New(time.Now())
	ownerA, ownerB := newOwner(t, store, clock, "worker-a"), newOwner(t, store, clock, "worker-b")
	settleOwnership(t, clock, ownerA)

	// a claims the first ten under its ownership.
	terms, validFor, done := ownerA.Hold()
	if validFor <= 0 {
		t.Fatal("a holds nothing")
	}
	a := fenceLease("worker-a", "token-a", time.Now())
	resA, err := store.Claim(t.Context(), a, events.ClaimLimit{Events: 10, Owned: sameTerms(terms, terms), Ordered: true, FailedHolds: true})
	done()
	if err != nil || len(resA.Claimed) != 10 {
		t.Fatalf("a's Claim = %d events, %v; want 10", len(resA.Claimed), err)
	}

	// a pauses; its terms run out; recovery resets its batch; b takes over.
	clock.Advance(testTerm + testTerm/5)
	if reset, _, err := store.RecoverStale(t.Context(), a.At.Add(time.Minute), a.At.Add(time.Minute), 10); err != nil || reset != 10 {
		t.Fatalf("RecoverStale = %d, %v; want 10", reset, err)
	}
	settleOwnership(t, clock, ownerB)

	// a wakes up: its claimer finds no partition to claim in, even after
	// its ownership round, which loses every renewal.
	cA, _ := newClaimer(t, store, idlePublisher{t}, Config{WorkerID: "worker-a", Owner: ownerA})
	if err := ownerA.Tick(t.Context()); err != nil {
		t.Fatalf("a's Tick: %v", err)
	}
	if n := len(ownerA.Owned()); n != 0 {
		t.Errorf("a owns %d partitions after b's takeover, want 0", n)
	}
	runOnce(t, cA)
	for _, id := range append(append([]string{}, ids...), extra...) {
		if e := allEvents(t, coll)[id]; e.WorkerID == "worker-a" {
			t.Errorf("event %s claimed by a after it lost its partitions: %s", id, e.Status)
		}
	}
	// b claims them; a's late writes for its old batch change nothing.
	terms, _, done = ownerB.Hold()
	b := fenceLease("worker-b", "token-b", time.Now())
	resB, err := store.Claim(t.Context(), b, events.ClaimLimit{Events: 100, Owned: sameTerms(terms, terms), Ordered: true, FailedHolds: true})
	done()
	if err != nil || len(resB.Claimed) != 15 {
		t.Fatalf("b's Claim = %d events, %v; want 15", len(resB.Claimed), err)
	}
	if n, err := store.MarkPublished(t.Context(), a, mongotest.IDs(resA.Claimed), time.Now()); err != nil || n != 0 {
		t.Errorf("a's late MarkPublished = %d, %v; want 0", n, err)
	}
	if n, err := store.Release(t.Context(), a, events.Release{IDs: mongotest.IDs(resA.Claimed), Status: events.StatusNew, Refund: true}); err != nil || n != 0 {
		t.Errorf("a's late Release = %d, %v; want 0", n, err)
	}
	var twice, once []string
	for _, id := range append(ids, extra...) {
		if claimedHex(resA.Claimed)[id] > 0 {
			twice = append(twice, id)
		} else {
			once = append(once, id)
		}
	}
	ownedBy(t, coll, b, 2, twice)
	ownedBy(t, coll, b, 1, once)
}

// TestOwnershipJoinAndDeath: a replica that joins gets its share within a
// few rounds, and the partitions of one that died are taken over once its
// terms run out; the events in them are claimed by the survivors.
func TestOwnershipJoinAndDeath(t *testing.T) {
	t.Parallel()
	store := mongotest.Store(t)
	clock := fakeclock.New(time.Now())
	a, b := newOwner(t, store, clock, "worker-a"), newOwner(t, store, clock, "worker-b")
	settleOwnership(t, clock, a)
	// b joins.
	settleOwnership(t, clock, a, b)
	if na, nb := len(a.Owned()), len(b.Owned()); na != 32 || nb != 32 {
		t.Errorf("after b joined: a owns %d, b %d; want 32 each", na, nb)
	}
	// b dies: a takes all once b's terms have run out, not before.
	bOwned := b.Owned()
	clock.Advance(testTerm / 3)
	if err := a.Tick(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := len(a.Owned()); n != 32 {
		t.Errorf("a owns %d while b's terms stand, want 32", n)
	}
	// a keeps ticking every third of a term, as its loop does.
	for range 4 {
		clock.Advance(testTerm / 3)
		if err := a.Tick(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(a.Owned()); n != events.Partitions {
		t.Errorf("a owns %d after b's terms ran out, want all %d (b had %v)", n, events.Partitions, bOwned)
	}
}
