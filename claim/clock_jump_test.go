package claim

// Order without transactions across a jump of the database clock's
// offset, against the real store: a replica whose view of the server's
// time jumps ahead sees the other's terms end early.

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/fakeclock"
	"github.com/outboxrelay/outbox/mongo/mongotest"
	"github.com/outboxrelay/outbox/ownership"
	"github.com/outboxrelay/outbox/service"
)

// a owns every partition and reads x1 and x2 to claim them, then pauses
// (no renewal) with its own deadline still ahead. b's clock measures a
// server time four margins ahead (a failover to a node whose clock is
// ahead): by it a's terms ended a margin ago. b must count the jump as
// losing every partition for a term, not take a's, and claim nothing
// between a's read and a's write.
func TestClockJumpDoesNotOverlapClaims(t *testing.T) {
	t.Parallel()
	store := mongotest.Store(t)
	coll := store.Collection()
	ids, _ := insertAggregate(t, coll, "clock-jump", 2)
	clock := fakeclock.New(time.Now())
	margin := testTerm / ownership.MarginDivisorDefault
	var jump atomic.Int64
	ownerA := newOwner(t, store, clock, "worker-a")
	ownerB, err := ownership.New(store.Owners(), ownership.Config{WorkerID: "worker-b", TermLength: testTerm,
		Archetype: service.Archetype{Now: func() time.Time { return clock.Now().Add(time.Duration(jump.Load())) }, Local: clock.Now, Logger: discard}})
	if err != nil {
		t.Fatal(err)
	}
	settleOwnership(t, clock, ownerA)
	if err := ownerB.Tick(t.Context()); err != nil { // b runs, owning nothing
		t.Fatal(err)
	}
	clock.Advance(testTerm - 5*margin/2) // a's claims have half a margin left

	// a reads.
	termsA, validFor, done := ownerA.Hold()
	done()
	if validFor <= 0 {
		t.Fatal("a may not claim: the test does not test the case")
	}
	limitA := events.ClaimLimit{Events: 10, Owned: sameTerms(termsA, termsA), Tenures: termsA, Ordered: true, FailedHolds: true}
	docs, _, err := store.ReadClaimable(t.Context(), clock.Now(), limitA)
	if err != nil || len(docs) != 2 {
		t.Fatalf("a's read = %d events, %v; want 2", len(docs), err)
	}

	// b's clock jumps; b runs its round and claims.
	jump.Store(int64(4 * margin))
	ownerB.ClockJumped(4 * margin)
	if err := ownerB.Tick(t.Context()); err != nil {
		t.Fatalf("b's Tick: %v", err)
	}
	termsB, _, done := ownerB.Hold()
	b := fenceLease("worker-b", "token-b", clock.Now())
	resB, err := store.Claim(t.Context(), b, events.ClaimLimit{Events: 10, Owned: sameTerms(termsB, termsB), Tenures: termsB, Ordered: true, FailedHolds: true})
	done()
	if err != nil {
		t.Fatalf("b's claim: %v", err)
	}

	// a writes, within what its Hold still gives it.
	termsA2, validFor, done := ownerA.Hold()
	if validFor <= 0 {
		t.Fatal("a's validity ran out: the test does not test the case")
	}
	a := fenceLease("worker-a", "token-a", clock.Now())
	resA, err := store.ClaimRead(t.Context(), a, keepOwned(docs, sameTerms(termsA, termsA2)), limitA)
	done()
	if err != nil {
		t.Fatalf("a's write: %v", err)
	}
	if len(resB.Claimed) > 0 {
		t.Errorf("b claimed %d events (a claimed %d) between a's read and a's write in partitions a still held", len(resB.Claimed), len(resA.Claimed))
	}
	for p := range termsB {
		if termsB[p] != 0 && termsA2[p] != 0 {
			t.Fatalf("partition %d held by a and b at once after b's clock jumped", p)
		}
	}
	if got := heldBy(t, coll, a, ids); len(got) != 2 {
		t.Errorf("a holds %v, want both events it read", got)
	}
}
