// Package tally counts the deliveries of a queue by message id: how many
// times each id arrived, when it first did, and in which order the ids
// first came. The end-to-end tests and the benchmark harness both check
// what the worker delivered with it.
package tally

import (
	"context"
	"maps"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Tally is safe for concurrent use: one goroutine adds, others read.
type Tally struct {
	mu      sync.Mutex
	counts  map[string]int
	first   map[string]time.Time
	firstAt map[string]int // position of the first delivery among all
	order   []string       // ids in order of first arrival
	total   int            // deliveries, duplicates included
	last    time.Time
	lastNew time.Time     // when the last id not seen before arrived
	grown   chan struct{} // closed when a new id arrives, then replaced
}

// New returns an empty Tally.
func New() *Tally {
	return &Tally{counts: map[string]int{}, first: map[string]time.Time{}, firstAt: map[string]int{}, grown: make(chan struct{})}
}

// Consume adds every delivery until deliveries is closed; the returned
// channel is closed then.
func (t *Tally) Consume(deliveries <-chan amqp.Delivery) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range deliveries {
			t.Add(d.MessageId, time.Now())
		}
	}()
	return done
}

// Add counts one delivery of id that arrived at at.
func (t *Tally) Add(id string, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	pos := t.total
	t.total++
	t.last = at
	t.counts[id]++
	if t.counts[id] > 1 {
		return
	}
	t.first[id] = at
	t.firstAt[id] = pos
	t.order = append(t.order, id)
	t.lastNew = at
	close(t.grown)
	t.grown = make(chan struct{})
}

// Snapshot returns the distinct ids and the deliveries so far, and when
// the last delivery arrived.
func (t *Tally) Snapshot() (distinct, total int, last time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.counts), t.total, t.last
}

// Counts returns how many times each id arrived.
func (t *Tally) Counts() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.counts)
}

// FirstArrivals returns when each id first arrived.
func (t *Tally) FirstArrivals() map[string]time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.first)
}

// FirstPositions returns the position of each id's first delivery among
// all deliveries, duplicates included, from 0.
func (t *Tally) FirstPositions() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.firstAt)
}

// Order returns the ids in order of first arrival (one queue, one
// consumer: the order the queue held them in), and when the last of them
// arrived.
func (t *Tally) Order() ([]string, time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.order...), t.lastNew
}

// WaitDistinct waits until n distinct ids have arrived or ctx ends.
func (t *Tally) WaitDistinct(ctx context.Context, n int) error {
	for {
		t.mu.Lock()
		got, grown := len(t.counts), t.grown
		t.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-grown:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
