package claim

// Fencing, proven with deterministic interleavings against the real store:
// every write after a claim names the lease (worker id and token), so a
// worker whose claim was recovered and handed on changes nothing.

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/v2/event"
	driver "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/mongo/mongotest"
)

func claimedHex(cs []events.Claimed) map[string]int {
	out := make(map[string]int, len(cs))
	for _, c := range cs {
		out[testenv.MessageID(c.ID)]++
	}
	return out
}

// fenceLease is a lease taken at the tests' clock.
func fenceLease(worker, token string, at time.Time) events.Lease {
	return events.Lease{WorkerID: worker, Token: token, At: at.UTC().Truncate(time.Millisecond)}
}

// ownedBy checks that every event is still PROCESSING under lease l.
func ownedBy(t *testing.T, coll *driver.Collection, l events.Lease, attempts int, ids []string) {
	t.Helper()
	all := allEvents(t, coll)
	for _, id := range ids {
		e := all[id]
		got := stored{Status: e.Status, Delivery: e.Delivery}
		// Recovery's note may stay, in lastError and the attempts' errors;
		// nothing else may change.
		got.AttemptErrors = nil
		want := stored{Status: events.StatusProcessing, Delivery: events.Delivery{WorkerID: l.WorkerID, ClaimToken: l.Token,
			Attempts: attempts, ProcessingAt: l.At, LastError: e.LastError}}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("event %s (-want +got):\n%s", id, diff)
		}
	}
}

// claimRecoverReclaim runs the interleaving every fencing test starts
// with: a claims the events, recovery finds a's claim stale and resets it,
// and b claims them again.
func claimRecoverReclaim(t *testing.T, store *mongo.Store, a, b events.Lease, n int) []events.Claimed {
	t.Helper()
	ctx := t.Context()
	got, _, err := claimN(ctx, store, a, n)
	if err != nil || len(got) != n {
		t.Fatalf("a's Claim = %d events, %v; want %d", len(got), err, n)
	}
	// A staleBefore after a's claim: a looks dead (a long GC pause, a
	// partition) though it is about to write.
	reset, failed, err := store.RecoverStale(ctx, a.At.Add(time.Minute), a.At.Add(time.Minute), 10)
	if err != nil || reset != n || failed != 0 {
		t.Fatalf("RecoverStale = reset %d, failed %d, %v; want %d, 0, nil", reset, failed, err, n)
	}
	again, _, err := claimN(ctx, store, b, n)
	if err != nil {
		t.Fatalf("b's Claim: %v", err)
	}
	if diff := cmp.Diff(claimedHex(got), claimedHex(again)); diff != "" {
		t.Fatalf("b re-claimed other events than a lost (-a +b):\n%s", diff)
	}
	return got
}

// TestFencingLateWriterChangesNothing: a lease whose events were recovered
// and claimed again, by another worker or by the same worker's next run
// under a new token, writes nothing: neither before the new lease settles
// nor after.
func TestFencingLateWriterChangesNothing(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for _, tc := range []struct {
		name      string
		late, now events.Lease
	}{
		{"other worker", fenceLease("worker-a", "token-a", now), fenceLease("worker-b", "token-b", now.Add(time.Second))},
		// One worker, two runs: the first hung past the stale threshold,
		// the second re-claimed the same events under a new token.
		{"same worker, new token", fenceLease("worker-a", "token-1", now), fenceLease("worker-a", "token-2", now.Add(time.Second))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store := mongotest.Store(t)
			coll := store.Collection()
			ids := insertEvents(t, coll, 6, "order.created")
			a, b := tc.late, tc.now
			claimed := mongotest.IDs(claimRecoverReclaim(t, store, a, b, len(ids)))
			ownedBy(t, coll, b, 2, ids)

			// a wakes up with its confirms and writes every outcome it could.
			ctx := t.Context()
			if n, err := store.MarkPublished(ctx, a, claimed, now); err != nil || n != 0 {
				t.Errorf("a's late MarkPublished = %d, %v; want 0, nil", n, err)
			}
			for _, r := range []events.Release{
				{IDs: claimed, Status: events.StatusNew, LastError: "a: nacked", RetryAt: now.Add(time.Hour)},
				{IDs: claimed, Status: events.StatusNew, LastError: "a: broker down", Refund: true},
				{IDs: claimed, Status: events.StatusFailed, LastError: "a: gave up"},
			} {
				if n, err := store.Release(ctx, a, r); err != nil || n != 0 {
					t.Errorf("a's late Release to %s (refund %t) = %d, %v; want 0, nil", r.Status, r.Refund, n, err)
				}
			}
			ownedBy(t, coll, b, 2, ids)

			// b completes.
			if n, err := store.MarkPublished(ctx, b, claimed, now.Add(2*time.Second)); err != nil || n != len(ids) {
				t.Errorf("b's MarkPublished = %d, %v; want %d, nil", n, err, len(ids))
			}
			// And a's writes still change nothing on a PUBLISHED event.
			if n, err := store.Release(ctx, a, events.Release{IDs: claimed, Status: events.StatusNew}); err != nil || n != 0 {
				t.Errorf("a's Release after b published = %d, %v; want 0, nil", n, err)
			}
			for id, e := range allEvents(t, coll) {
				if e.Status != events.StatusPublished || e.WorkerID != b.WorkerID || e.ClaimToken != b.Token {
					t.Errorf("event %s: %s by %q under %q, want PUBLISHED by %s under %s", id, e.Status, e.WorkerID, e.ClaimToken, b.WorkerID, b.Token)
				}
			}
		})
	}
}

// claimSplit is where the tests of two claims on one outbox start: ten
// NEW events, and the leases of workers a and b, taken at the same time.
// a claims four, b ten, and each must get only its share.
type claimSplit struct {
	store *mongo.Store
	ids   []string
	a, b  events.Lease
}

func newClaimSplit(t *testing.T) claimSplit {
	t.Helper()
	store := mongotest.Store(t)
	now := time.Now()
	return claimSplit{store: store, ids: insertEvents(t, store.Collection(), 10, "order.created"),
		a: fenceLease("worker-a", "token-a", now), b: fenceLease("worker-b", "token-b", now)}
}

// check checks that a got and holds the four oldest events, and b the
// six a left.
func (s claimSplit) check(t *testing.T, gotA, gotB []events.Claimed) {
	t.Helper()
	if diff := cmp.Diff(once(s.ids[:4]), claimedHex(gotA)); diff != "" {
		t.Errorf("a's claim (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(once(s.ids[4:]), claimedHex(gotB)); diff != "" {
		t.Errorf("b's claim of what a left (-want +got):\n%s", diff)
	}
	ownedBy(t, s.store.Collection(), s.a, 1, s.ids[:4])
	ownedBy(t, s.store.Collection(), s.b, 1, s.ids[4:])
}

// TestClaimSecondLeaseGetsOnlyNew: two claims in sequence; the second
// takes only what the first left NEW.
func TestClaimSecondLeaseGetsOnlyNew(t *testing.T) {
	t.Parallel()
	s := newClaimSplit(t)
	gotA, _, err := claimN(t.Context(), s.store, s.a, 4)
	if err != nil {
		t.Fatalf("a's Claim: %v", err)
	}
	gotB, _, err := claimN(t.Context(), s.store, s.b, 10)
	if err != nil {
		t.Fatalf("b's Claim: %v", err)
	}
	s.check(t, gotA, gotB)
}

// TestClaimLosesRaceBetweenFindAndUpdate drives Claim's race path: b
// reads ten NEW events, then, before b's guarded update reaches the
// server, a claims the four oldest. b must end up with exactly the six a
// left, read back by its token, and a's four must stay a's.
func TestClaimLosesRaceBetweenFindAndUpdate(t *testing.T) {
	t.Parallel()
	s := newClaimSplit(t)

	// b's client runs a's claim, on a's own client, from the moment b's
	// first update command starts: after b's find, before b's update.
	var armed atomic.Bool
	var gotA []events.Claimed
	var errA error
	monitor := &event.CommandMonitor{Started: func(ctx context.Context, e *event.CommandStartedEvent) {
		if e.CommandName == "update" && armed.CompareAndSwap(true, false) {
			gotA, _, errA = claimN(context.WithoutCancel(ctx), s.store, s.a, 4)
		}
	}}
	clientB, err := driver.Connect(options.Client().ApplyURI(testenv.MongoURI(t)).
		SetMaxPoolSize(4).SetMonitor(monitor))
	if err != nil {
		t.Fatalf("connect b: %v", err)
	}
	t.Cleanup(func() { _ = clientB.Disconnect(context.Background()) })
	storeB := mongo.New(clientB, mongo.Config{Database: s.store.Collection().Database().Name(), Logger: discard})

	armed.Store(true)
	gotB, fullB, err := claimN(t.Context(), storeB, s.b, 10)
	if err != nil {
		t.Fatalf("b's Claim: %v", err)
	}
	if !fullB {
		// b found a whole batch: it must claim again at once, not idle
		// until its next tick because a took part of it.
		t.Error("b's Claim after losing four of ten: full = false, want true")
	}
	if armed.Load() {
		t.Fatal("b's Claim sent no update command: the interleaving never happened")
	}
	if errA != nil {
		t.Fatalf("a's Claim inside b's: %v", errA)
	}
	s.check(t, gotA, gotB)
	for _, c := range gotB {
		if c.Attempts != 1 {
			t.Errorf("b's claim of %v: Attempts = %d, want 1 (as stored)", c.ID, c.Attempts)
		}
		if got := c.Doc.Lookup(events.FieldClaimToken).StringValue(); got != s.b.Token {
			t.Errorf("b's claim of %v: document read back with token %q, want %q", c.ID, got, s.b.Token)
		}
	}
}

// TestRunOnceLateConfirmAfterRecovery is the whole story through the
// claimer: worker a publishes a batch; while its confirms come in, recovery
// resets the batch and worker b claims it. a's PUBLISHED write must change
// nothing and count the claims as lost; b then completes.
func TestRunOnceLateConfirmAfterRecovery(t *testing.T) {
	t.Parallel()
	r := setup(t)
	pub := &faultPublisher{Publisher: newPublisher(t, r.exchange)}
	c, m := newClaimer(t, r.store, pub, Config{WorkerID: "worker-a"})
	ids := insertEvents(t, r.coll, 8, "order.created")

	b := fenceLease("worker-b", "token-b", time.Now().Add(2*time.Minute))
	var gotB []events.Claimed
	pub.during = func() {
		ctx := context.WithoutCancel(t.Context())
		if _, _, err := r.store.RecoverStale(ctx, b.At, b.At, 10); err != nil {
			t.Errorf("RecoverStale: %v", err)
		}
		var err error
		if gotB, _, err = claimN(ctx, r.store, b, 100); err != nil {
			t.Errorf("b's Claim: %v", err)
		}
	}
	if _, err := c.runOnce(t.Context()); err != nil {
		t.Fatalf("a's runOnce: %v", err)
	}
	if diff := cmp.Diff(once(ids), claimedHex(gotB)); diff != "" {
		t.Fatalf("b's claim during a's publish (-want +got):\n%s", diff)
	}
	// a's messages went out: the broker has them once.
	if diff := cmp.Diff(once(ids), testenv.Receive(t, r.deliveries, ids, waitFor)); diff != "" {
		t.Errorf("a's messages (-want +got):\n%s", diff)
	}
	ownedBy(t, r.coll, b, 2, ids)
	if got := testutil.ToFloat64(m.Published); got != 0 {
		t.Errorf("a's published metric = %v, want 0: its write matched nothing", got)
	}
	if got := testutil.ToFloat64(m.LostClaims); got != float64(len(ids)) {
		t.Errorf("a's lost claims = %v, want %d", got, len(ids))
	}

	if n, err := r.store.MarkPublished(t.Context(), b, mongotest.IDs(gotB), time.Now()); err != nil || n != len(ids) {
		t.Errorf("b's MarkPublished = %d, %v; want %d, nil", n, err, len(ids))
	}
	for id, e := range allEvents(t, r.coll) {
		if e.Status != events.StatusPublished || e.WorkerID != b.WorkerID {
			t.Errorf("event %s: %s by %q, want PUBLISHED by %s", id, e.Status, e.WorkerID, b.WorkerID)
		}
	}
}
