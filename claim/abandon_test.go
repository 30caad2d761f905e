package claim

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/fakeclock"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/mongo/mongotest"
	"github.com/outboxrelay/outbox/service"
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
// NEW at once, and once a release after the write's deadline finds
// nothing more (the failed write is over), the next run relays them.
func TestFailedClaimReleasesWhatItTook(t *testing.T) {
	t.Parallel()
	r := setup(t)
	store := &failingClaimStore{Store: r.store}
	clock := fakeclock.New(time.Now())
	c, _ := newClaimer(t, store, newPublisher(t, r.exchange), Config{BatchSize: 50, Archetype: service.Archetype{Now: clock.Now}})
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
	// Its error came back at once, but the write could land until its
	// deadline (the stale threshold, without an owner): past it, the
	// second release finds nothing and the aggregates are free.
	clock.Advance(c.cfg.StaleAfter + abandonSettle)
	runOnce(t, c)
	runOnce(t, c)
	testenv.Receive(t, r.deliveries, ids, waitFor)
}

// deadlineStore records the deadline each release was given.
type deadlineStore struct {
	Store
	deadlines []time.Time
}

func (s *deadlineStore) Abandon(ctx context.Context, _ events.Lease) (int, error) {
	d, _ := ctx.Deadline()
	s.deadlines = append(s.deadlines, d)
	return 0, context.DeadlineExceeded
}

// A release may take until recovery would own the lease's events, not a
// fixed few seconds: on a database slow enough to fail the claim, a short
// release deadline would only hand the events to recovery, an attempt
// poorer each.
func TestAbandonedReleaseHasUntilStale(t *testing.T) {
	t.Parallel()
	const staleAfter = time.Minute
	clock := fakeclock.New(time.Now())
	a := abandonedLeases{staleAfter: staleAfter}
	store := &deadlineStore{}
	lease := events.Lease{WorkerID: "w", Token: "t", At: clock.Now()}
	a.add(lease, nil, clock.Now(), 0)

	clock.Advance(20 * time.Second)
	before := time.Now()
	a.retry(t.Context(), store, clock.Now(), slog.New(slog.DiscardHandler))
	if len(store.deadlines) != 1 {
		t.Fatalf("%d releases, want 1", len(store.deadlines))
	}
	// 40 s of the stale threshold are left (less the test's own pace on a
	// busy host).
	if got := store.deadlines[0].Sub(before); got < 30*time.Second || got > 41*time.Second {
		t.Errorf("release deadline %s away, want the 40s left before recovery owns the events", got)
	}

	// Past the stale threshold the releases go on, with half a threshold
	// each: recovery may not have run yet.
	clock.Advance(staleAfter)
	before = time.Now()
	a.retry(t.Context(), store, clock.Now(), slog.New(slog.DiscardHandler))
	if len(store.deadlines) != 2 || len(a.pending) != 1 {
		t.Fatalf("after the stale threshold: %d releases, %d pending; want a second release and the lease kept", len(store.deadlines), len(a.pending))
	}
	if got := store.deadlines[1].Sub(before); got < 20*time.Second || got > 31*time.Second {
		t.Errorf("release deadline past the stale threshold %s away, want half the threshold", got)
	}
}

// countStore answers each release with the next of its counts.
type countStore struct {
	Store
	counts []int
}

func (s *countStore) Abandon(context.Context, events.Lease) (int, error) {
	n := s.counts[0]
	s.counts = s.counts[1:]
	return n, nil
}

// A claim's write that lands after the stale threshold, when recovery may
// be minutes away (it yields to slow claims), is still put back by the
// claimer: the lease is forgotten only once two releases in a row past the
// threshold find nothing, or after abandonForgetAfter thresholds.
func TestAbandonedReleaseOutlastsTheStaleThreshold(t *testing.T) {
	t.Parallel()
	const staleAfter = 10 * time.Second
	logger := slog.New(slog.DiscardHandler)
	clock := fakeclock.New(time.Now())
	a := abandonedLeases{staleAfter: staleAfter}
	lease := events.Lease{WorkerID: "w", Token: "t", At: clock.Now()}
	a.add(lease, nil, clock.Now(), 0)
	// Nothing landed at first; the write lands at the threshold; then
	// nothing is left.
	store := &countStore{counts: []int{0, 0, 20, 0, 0}}
	releases := 0
	for len(a.pending) > 0 && releases < 20 {
		a.retry(t.Context(), store, clock.Now(), logger)
		releases++
		clock.Advance(staleAfter / 2)
	}
	if len(store.counts) != 0 {
		t.Errorf("%d releases left unasked (%v): the lease was forgotten before the late write was put back", len(store.counts), store.counts)
	}
	if len(a.pending) != 0 {
		t.Errorf("lease still pending after two releases past the threshold found nothing")
	}

	// A database out of reach for good: the lease goes after
	// abandonForgetAfter thresholds.
	a.add(lease, nil, lease.At, 0)
	a.retry(t.Context(), &deadlineStore{}, lease.At.Add(abandonForgetAfter*staleAfter), logger)
	if len(a.pending) != 0 {
		t.Errorf("lease kept %d thresholds after its claim", abandonForgetAfter)
	}
}

// A claim whose write timed out and landed later is released while the
// broker is not ready too: the run used to return before the release, and
// recovery then freed the events a stale threshold later and charged them
// an attempt.
func TestFailedClaimIsReleasedWhileTheBrokerIsDown(t *testing.T) {
	t.Parallel()
	real := mongotest.Store(t)
	store := &lateWriteStore{Store: real, land: make(chan func(), 1)}
	coll := real.Collection()
	clock := fakeclock.New(time.Now())
	pub := &switchPublisher{}
	c, _ := newClaimer(t, store, pub, Config{BatchSize: 10, Archetype: service.Archetype{Now: clock.Now}, StaleAfter: time.Minute})
	insertEvents(t, coll, 10, "order.created")

	if _, err := c.runOnce(t.Context()); !isTimeout(err) {
		t.Fatalf("runOnce: %v, want the write's timeout", err)
	}
	(<-store.land)() // the server applies the claim after the first release
	if n := inStatus(t, coll, events.StatusProcessing); n != 10 {
		t.Fatalf("%d events PROCESSING after the late write, want 10", n)
	}
	pub.down.Store(true)
	clock.Advance(abandonSettle)
	runOnce(t, c) // paused: nothing to publish to
	for id, d := range allEvents(t, coll) {
		if d.Status != events.StatusNew || d.Attempts != 0 || d.ClaimToken != "" {
			t.Errorf("event %s with the broker down: %s, attempts %d, token %q; want NEW with its attempt refunded", id, d.Status, d.Attempts, d.ClaimToken)
		}
	}
}

// switchPublisher is a broker that is down while down is set; it fails
// every publish.
type switchPublisher struct{ down atomic.Bool }

func (p *switchPublisher) Ready() error {
	if p.down.Load() {
		return events.ErrUnavailable
	}
	return nil
}

func (p *switchPublisher) Publish(_ context.Context, msgs []events.Message) []error {
	errs := make([]error, len(msgs))
	for i := range errs {
		errs[i] = events.ErrUnavailable
	}
	return errs
}

// TestAbandonedKeysHeldUntilTheWriteCannotLand a claim
// write whose error came back early (a broken connection) may still be
// applied by the server until its own deadline: releases that find nothing
// before it prove nothing, and the write's aggregates stay held. Before:
// the second release that found nothing, 3 s into a write with 10 s left,
// freed them ("held after 2 empty releases before the write's deadline:
// map[], want the write's key").
func TestAbandonedKeysHeldUntilTheWriteCannotLand(t *testing.T) {
	t.Parallel()
	clock := fakeclock.New(time.Now())
	a := abandonedLeases{staleAfter: time.Minute}
	store := &countStore{counts: []int{0, 0, 0, 0, 0}}
	lease := events.Lease{WorkerID: "w", Token: "t", At: clock.Now()}
	a.add(lease, []string{"order\x00k"}, clock.Now(), 10*time.Second)
	logger := slog.New(slog.DiscardHandler)
	for range 2 {
		a.retry(t.Context(), store, clock.Now(), logger)
		clock.Advance(2 * abandonSettle)
	}
	if held := a.held(clock.Now()); !held["order\x00k"] {
		t.Errorf("held after 2 empty releases before the write's deadline: %v, want the write's key", held)
	}
	clock.Advance(10 * time.Second)
	a.retry(t.Context(), store, clock.Now(), logger)
	if held := a.held(clock.Now()); held["order\x00k"] {
		t.Errorf("held after an empty release past the write's deadline: %v, want none", held)
	}
}
