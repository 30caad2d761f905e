package claim

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
)

// readCounter is the real store, counting the claims' reads.
type readCounter struct {
	*mongo.Store
	reads atomic.Int64
}

func (s *readCounter) ReadClaimable(ctx context.Context, now time.Time, limit events.ClaimLimit) ([]bson.Raw, bool, error) {
	s.reads.Add(1)
	return s.Store.ReadClaimable(ctx, now, limit)
}

// An outbox whose claims find nothing is read less and less often, far
// less than once a tick, and an event written after that idle is still
// relayed. Only upper bounds on the reads are checked: a busy host makes
// fewer runs, never more.
func TestIdleClaimsBackOff(t *testing.T) {
	t.Parallel()
	const tick, idleMax, window = 10 * time.Millisecond, 250 * time.Millisecond, time.Second
	r := setup(t)
	store := &readCounter{Store: r.store}
	c, _ := newClaimer(t, store, newPublisher(t, r.exchange), Config{Schedule: "@every " + tick.String(), IdleMax: idleMax})
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.WithoutCancel(t.Context())) })
	// Idle for at least two idleMax: the runs are idleMax apart by then.
	testenv.Eventually(t, waitFor, func() (bool, string) {
		since := c.IdleSince()
		return !since.IsZero() && time.Since(since) > 2*idleMax, "claims idle for 2 IdleMax"
	})
	before := store.reads.Load()
	time.Sleep(window) // the window the reads are counted in, not a wait for the loop
	// At most a run per idleMax (less a twentieth), and one more for the
	// edge: 5 against the window's 100 ticks.
	if n, most := store.reads.Load()-before, int64(window/(idleMax*19/20))+1; n > most {
		t.Errorf("%d claim reads in %s of idle at @every %s with IdleMax %s, want at most %d", n, window, tick, idleMax, most)
	}
	ids := insertEvents(t, r.coll, 1, "order.created")
	testenv.Receive(t, r.deliveries, ids, waitFor)
	testenv.Eventually(t, waitFor, func() (bool, string) { return !c.IdleSince().IsZero(), "claims idle again after the event" })
}

// emptyStore is a Store with nothing to claim.
type emptyStore struct{ Store }

func (emptyStore) ReadClaimable(context.Context, time.Time, events.ClaimLimit) ([]bson.Raw, bool, error) {
	return nil, false, nil
}

// Only a claim that read the outbox and found nothing makes it idle, and
// keeps it idle from its first such claim; a claim that waited for the
// broker ends the idle: a relay that is blocked is not idle, and its
// gauges keep being sampled.
func TestIdleSinceOnlyForEmptyReads(t *testing.T) {
	t.Parallel()
	pub := &switchPublisher{} // nothing is claimed: nothing is published
	c, _ := newClaimer(t, emptyStore{}, pub, Config{})
	if !c.IdleSince().IsZero() {
		t.Fatal("IdleSince before any claim is set, want zero")
	}
	runOnce(t, c)
	first := c.IdleSince()
	if first.IsZero() {
		t.Fatal("IdleSince after a claim that found nothing is zero")
	}
	runOnce(t, c)
	if got := c.IdleSince(); !got.Equal(first) {
		t.Errorf("IdleSince after a second empty claim = %s, want the first's %s", got, first)
	}
	pub.down.Store(true)
	runOnce(t, c)
	if got := c.IdleSince(); !got.IsZero() {
		t.Errorf("IdleSince after a claim paused for the broker = %s, want zero", got)
	}
}
