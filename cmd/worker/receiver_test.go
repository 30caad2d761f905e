package main

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// receiver counts the deliveries of one exchange by message id.
type receiver struct {
	mu          sync.Mutex
	counts      map[string]int
	total       int
	first, last time.Time
}

// consume binds a queue to exchange (see testenv.Consume) and counts what
// arrives. Call it before starting workers.
func consume(t *testing.T, s stack, exchange string) *receiver {
	t.Helper()
	r := &receiver{counts: map[string]int{}}
	done := make(chan struct{})
	started := false
	// Registered before Consume's cleanup, so it runs after it: the
	// deliveries channel is closed by then and the goroutine returns.
	t.Cleanup(func() {
		if started {
			<-done
		}
	})
	deliveries := testenv.Consume(t, s.amqpURL, exchange)
	started = true
	go func() {
		defer close(done)
		for d := range deliveries {
			r.add(d)
		}
	}()
	return r
}

func (r *receiver) add(d amqp.Delivery) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if r.total == 0 {
		r.first = now
	}
	r.last = now
	r.total++
	r.counts[d.MessageId]++
}

// snapshot returns the distinct message ids, the deliveries, and when the
// last one arrived.
func (r *receiver) snapshot() (distinct, total int, last time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.counts), r.total, r.last
}

func (r *receiver) distinct() int {
	d, _, _ := r.snapshot()
	return d
}

// waitDistinct waits until n distinct messages have arrived.
func (r *receiver) waitDistinct(ctx context.Context, n int) error {
	err := poll(ctx, pollEvery, func() (bool, error) { return r.distinct() >= n, nil })
	if err != nil {
		d, total, _ := r.snapshot()
		return fmt.Errorf("%d of %d events received (%d deliveries): %w", d, n, total, err)
	}
	return nil
}

// waitIDs waits until every id has arrived.
func (r *receiver) waitIDs(ctx context.Context, ids []string) error {
	var missing []string
	err := poll(ctx, pollEvery, func() (bool, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		missing = missing[:0]
		for _, id := range ids {
			if r.counts[id] == 0 {
				missing = append(missing, id)
			}
		}
		return len(missing) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("%d of %d events never arrived (e.g. %v): %w", len(missing), len(ids), missing[:min(len(missing), 5)], err)
	}
	return nil
}

// drain waits, once every publisher has stopped, for deliveries still on
// their way: until none has arrived for a second, at most 15 s.
func (r *receiver) drain(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	_, total, _ := r.snapshot()
	quietSince := time.Now()
	_ = poll(ctx, pollEvery, func() (bool, error) {
		if _, now, _ := r.snapshot(); now != total {
			total, quietSince = now, time.Now()
		}
		return time.Since(quietSince) >= time.Second, nil
	})
}

// checkExactly checks that the message ids received are exactly ids.
func (r *receiver) checkExactly(t *testing.T, ids []string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
		if r.counts[id] == 0 {
			t.Errorf("event %s never arrived", id)
		}
	}
	for id := range r.counts {
		if !want[id] {
			t.Errorf("message %q arrived but no such event was inserted", id)
		}
	}
}
