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
