package broker_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/broker"
	"github.com/outboxrelay/outbox/events"
)

// TestPublishDuringReconnects publishes and asks Ready from several
// goroutines while the link is cut and restored again and again, then
// stops the publisher under them. Run with -race, it checks that the
// publisher's state is shared safely; every result is a confirm or an
// outage, never a rejection or a nack.
func TestPublishDuringReconnects(t *testing.T) {
	t.Parallel()
	p, proxy, _ := proxiedPublisher(t, broker.Config{})
	ctx, cancel := context.WithTimeout(t.Context(), 4*waitTimeout)
	defer cancel()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	results := make(chan error, 1024)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 0; ; round++ {
				select {
				case <-stop:
					return
				default:
				}
				_ = p.Ready()
				pubCtx, pubCancel := context.WithTimeout(ctx, 2*time.Second)
				for _, err := range p.Publish(pubCtx, messages(t, fmt.Sprintf("g%d-r%d", g, round), 20)) {
					if err != nil && !errors.Is(err, events.ErrUnavailable) && !errors.Is(err, events.ErrUnconfirmed) {
						select {
						case results <- err:
						default:
						}
					}
				}
				pubCancel()
			}
		}()
	}

	for range 5 {
		proxy.Cut()
		waitFor(t, waitTimeout, "Ready reports the cut", func() bool { return p.Ready() != nil })
		proxy.Restore()
		waitFor(t, waitTimeout, "reconnect after Restore", func() bool { return p.Ready() == nil })
	}
	stopCtx, stopCancel := context.WithTimeout(ctx, waitTimeout)
	defer stopCancel()
	if err := p.Stop(stopCtx); err != nil {
		t.Errorf("Stop during publishes: %v", err)
	}
	close(stop)
	wg.Wait()
	close(results)
	for err := range results {
		t.Errorf("publish during reconnects: %v, want nil, ErrUnavailable or ErrUnconfirmed", err)
	}
	if err := p.Ready(); !errors.Is(err, events.ErrUnavailable) {
		t.Errorf("Ready after Stop = %v, want ErrUnavailable", err)
	}
}
