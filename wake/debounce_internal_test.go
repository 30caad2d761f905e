package wake

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// A burst of notifications within one debounce period triggers once at
// once, and once more after the period: none is lost, none doubles.
func TestDebounceTriggersOncePerPeriod(t *testing.T) {
	t.Parallel()
	var triggers atomic.Int32
	w := &Watcher{cfg: Config{Trigger: func() { triggers.Add(1) }, Debounce: time.Hour}, kick: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.debounce(ctx)
	}()
	for range 100 {
		w.notify()
	}
	testenv.Eventually(t, testenv.WaitTimeout, func() (bool, string) {
		return triggers.Load() > 0, "no trigger after a notification"
	})
	for range 100 {
		w.notify() // during the hour: kept, one at most
	}
	cancel()
	<-done
	if n := triggers.Load(); n != 1 {
		t.Errorf("%d triggers within one debounce period, want 1", n)
	}
	if len(w.kick) != 1 {
		t.Errorf("%d notifications pending after the burst, want 1 (kept for the next period)", len(w.kick))
	}
}
