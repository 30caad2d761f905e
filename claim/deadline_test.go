package claim

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/fakeclock"
	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/mongo/mongotest"
	"github.com/outboxrelay/outbox/service"
)

// pausingStore is the store of a worker that pauses (SIGSTOP, a VM
// migration, a long GC) right after its claim's write returns: the local
// clock moves on by pause before anything is published.
type pausingStore struct {
	*mongo.Store
	clock *fakeclock.Clock
	pause time.Duration
}

func (s pausingStore) ClaimRead(ctx context.Context, lease events.Lease, docs []bson.Raw, limit events.ClaimLimit) (events.ClaimResult, error) {
	res, err := s.Store.ClaimRead(ctx, lease, docs, limit)
	s.clock.Advance(s.pause)
	return res, err
}

// clockPublisher confirms everything, records each Publish call's message
// ids, and lets each call take round on the local clock.
type clockPublisher struct {
	clock *fakeclock.Clock
	round time.Duration
	calls [][]string
}

func (p *clockPublisher) Ready() error { return nil }

func (p *clockPublisher) Publish(_ context.Context, msgs []events.Message) []error {
	var ids []string
	for _, m := range msgs {
		ids = append(ids, m.ID)
	}
	p.calls = append(p.calls, ids)
	p.clock.Advance(p.round)
	return make([]error, len(msgs))
}

// A batch is published only while its claim is fresh on the local
// monotonic clock: no round starts, and no unordered publish, once the
// claim could be recovered (StaleAfter after its write, less a margin).
// What is not published goes back to NEW with its attempt refunded. A
// worker paused past the stale threshold between its claim and its
// publish publishes nothing of the batch; one whose deadline falls
// between two rounds publishes the rounds before it. Before, the whole
// batch went out whenever the worker resumed.
func TestPublishStopsWhenTheClaimCouldBeRecovered(t *testing.T) {
	t.Parallel()
	const (
		n          = 40
		staleAfter = 10 * time.Second
		margin     = staleAfter / staleMarginDivisor
	)
	cases := []struct {
		name     string
		ordering string
		pause    time.Duration // after the claim's write
		round    time.Duration // each Publish call
		rounds   int           // Publish calls wanted
	}{
		{"ordered, paused past the stale threshold", OrderingAggregate, staleAfter + time.Second, 0, 0},
		{"ordered, paused into the margin", OrderingAggregate, staleAfter - margin, 0, 0},
		{"ordered, deadline between rounds", OrderingAggregate, staleAfter - margin - time.Second, 400 * time.Millisecond, 3},
		{"ordered, not paused", OrderingAggregate, 0, 0, 4},
		{"unordered, paused past the stale threshold", OrderingNone, staleAfter + time.Second, 0, 0},
		{"unordered, not paused", OrderingNone, 0, 0, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := fakeclock.New(time.Now())
			store := mongotest.Store(t)
			want := insertInterleaved(t, store.Collection(), n, 10) // 4 rounds: 4 events of each aggregate
			pub := &clockPublisher{clock: clock, round: tc.round}
			c, m := newClaimer(t, pausingStore{store, clock, tc.pause}, pub, Config{
				Ordering: tc.ordering, BatchSize: n, StaleAfter: staleAfter, PublishTimeout: staleAfter / 2, Archetype: service.Archetype{Local: clock.Mono},
			})
			if _, err := c.runOnce(t.Context()); err != nil {
				t.Fatalf("runOnce: %v", err)
			}
			if len(pub.calls) != tc.rounds {
				t.Fatalf("Publish calls: %d (%v), want %d", len(pub.calls), pub.calls, tc.rounds)
			}
			sent := map[string]bool{}
			for _, call := range pub.calls {
				for _, id := range call {
					sent[id] = true
				}
			}
			stored := allEvents(t, store.Collection())
			for _, e := range want {
				got := stored[e.id]
				switch {
				case sent[e.id] && got.Status != events.StatusPublished:
					t.Errorf("event %s published but %s", e.id, got.Status)
				case !sent[e.id] && (got.Status != events.StatusNew || got.Attempts != 0):
					t.Errorf("event %s not published: %s with %d attempts, want NEW with the attempt refunded", e.id, got.Status, got.Attempts)
				}
			}
			if unsent := n - len(sent); unsent > 0 {
				if got := testutil.ToFloat64(m.Released.WithLabelValues(metrics.ReasonUnconfirmed)); got != float64(unsent) {
					t.Errorf("released as unconfirmed: %v, want %d", got, unsent)
				}
			}
		})
	}
}
