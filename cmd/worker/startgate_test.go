package main

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// A gate runs at most its size of attempts at once, and a wait for a slot
// ends with the caller's context without running the attempt.
func TestStartGateBoundsAttempts(t *testing.T) {
	t.Parallel()
	const size, callers = 3, 12
	g := newStartGate(size)
	var running, most atomic.Int32
	release := make(chan struct{})
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			_ = g.attempt(t.Context(), func(context.Context) error {
				n := running.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				<-release
				running.Add(-1)
				return nil
			})
		})
	}
	testenv.Eventually(t, testenv.WaitTimeout, func() (bool, string) {
		return running.Load() == size, "every slot taken"
	})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	ran := false
	if err := g.attempt(ctx, func(context.Context) error { ran = true; return nil }); !errors.Is(err, context.Canceled) || ran {
		t.Errorf("attempt with every slot taken and its context ended = %v (ran %t), want context.Canceled without running", err, ran)
	}
	close(release)
	wg.Wait()
	if m := most.Load(); m != size {
		t.Errorf("at most %d attempts ran at once, want %d", m, size)
	}
}
