package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/internal/tally"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// receiver counts the deliveries of one exchange by message id.
type receiver struct{ *tally.Tally }

// consume binds a queue to exchange (see testenv.Consume) and counts what
// arrives. Call it before starting workers.
func consume(t *testing.T, s stack, exchange string) *receiver {
	t.Helper()
	r := &receiver{tally.New()}
	var done <-chan struct{}
	// Registered before Consume's cleanup, so it runs after it: the
	// deliveries channel is closed by then and the tally's goroutine
	// returns.
	t.Cleanup(func() {
		if done != nil {
			<-done
		}
	})
	done = r.Consume(testenv.Consume(t, s.amqpURL, exchange))
	return r
}

func (r *receiver) distinct() int {
	d, _, _ := r.Snapshot()
	return d
}

// arrivedOf returns those of ids that have arrived.
func (r *receiver) arrivedOf(ids []string) []string {
	counts := r.Counts()
	var out []string
	for _, id := range ids {
		if counts[id] > 0 {
			out = append(out, id)
		}
	}
	return out
}

// waitDistinct waits until n distinct messages have arrived, until ctx's
// deadline.
func (r *receiver) waitDistinct(ctx context.Context, t *testing.T, n int) {
	t.Helper()
	testenv.Eventually(t, timeLeft(ctx), func() (bool, string) {
		d, total, _ := r.Snapshot()
		return d >= n, fmt.Sprintf("%d of %d events received (%d deliveries)", d, n, total)
	})
}

// waitIDs waits until every id has arrived, until ctx's deadline.
func (r *receiver) waitIDs(ctx context.Context, t *testing.T, ids []string) {
	t.Helper()
	testenv.Eventually(t, timeLeft(ctx), func() (bool, string) {
		counts := r.Counts()
		var missing []string
		for _, id := range ids {
			if counts[id] == 0 {
				missing = append(missing, id)
			}
		}
		return len(missing) == 0, fmt.Sprintf("%d of %d events never arrived (e.g. %v)", len(missing), len(ids), missing[:min(len(missing), 5)])
	})
}

// drain waits, once every publisher has stopped, for deliveries still on
// their way: until none has arrived for a second. With nothing left to
// publish them, deliveries that keep coming for 15 s are a failure.
func (r *receiver) drain(t *testing.T) {
	t.Helper()
	_, total, _ := r.Snapshot()
	quietSince := time.Now()
	testenv.Eventually(t, 15*time.Second, func() (bool, string) {
		if _, now, _ := r.Snapshot(); now != total {
			total, quietSince = now, time.Now()
		}
		return time.Since(quietSince) >= time.Second, fmt.Sprintf("still receiving after every worker stopped (%d deliveries)", total)
	})
}

// checkExactly checks that the message ids received are exactly ids.
func (r *receiver) checkExactly(t *testing.T, ids []string) {
	t.Helper()
	counts := r.Counts()
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
		if counts[id] == 0 {
			t.Errorf("event %s never arrived", id)
		}
	}
	for id := range counts {
		if !want[id] {
			t.Errorf("message %q arrived but no such event was inserted", id)
		}
	}
}
