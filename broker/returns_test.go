package broker_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/broker"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// stalledPublisher starts a publisher through a proxy, with a window of
// the given size, to an exchange where only "order.created" is routable.
func stalledPublisher(t *testing.T, window int) (*broker.Publisher, *testenv.Proxy) {
	t.Helper()
	p, proxy, _ := proxiedPublisher(t, broker.Config{Window: window}, "order.created")
	return p, proxy
}

// timeOut publishes msgs while the proxy is stalled, so that the window
// ends at its deadline with every confirm outstanding, then restores the
// link: the broker receives the messages after all, and routes or returns
// them, after Publish has given up on them.
func timeOut(t *testing.T, p *broker.Publisher, proxy *testenv.Proxy, msgs []events.Message) {
	t.Helper()
	proxy.Stall()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	for i, err := range p.Publish(ctx, msgs) {
		if !errors.Is(err, events.ErrUnconfirmed) {
			t.Fatalf("message %d published while stalled: %v, want ErrUnconfirmed", i, err)
		}
	}
	proxy.Restore()
	waitFor(t, waitTimeout, "ready after the timed-out window", func() bool { return p.Ready() == nil })
}

// A return that comes after its window timed out is never taken for a
// later publish of the same event: the republish gets its own outcome.
func TestLateReturnIsNotTakenForRepublish(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name             string
		first, republish string // event types; "order.created" is routable
		wantReturned     bool
	}{
		{"unroutable then routable", "nobody.listens", "order.created", false},
		{"routable then unroutable", "order.created", "nobody.listens", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, proxy := stalledPublisher(t, broker.WindowDefault)
			timeOut(t, p, proxy, []events.Message{simpleMessage(t, "event-1", tt.first)})

			ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
			defer cancel()
			err := p.Publish(ctx, []events.Message{simpleMessage(t, "event-1", tt.republish)})[0]
			switch {
			case tt.wantReturned && !errors.Is(err, events.ErrReturned):
				t.Errorf("republish as %s: %v, want ErrReturned", tt.republish, err)
			case !tt.wantReturned && err != nil:
				t.Errorf("republish as %s: %v, want confirmed: the late return belongs to the first publish", tt.republish, err)
			}
		})
	}
}

// Returns are never dropped nor left to block the connection: windows of
// unroutable messages, one of them timed out with its returns still to
// come, are each reported returned in full.
func TestManyReturnsAreAllReported(t *testing.T) {
	t.Parallel()
	const window = 50
	p, proxy := stalledPublisher(t, window)
	unroutable := func(prefix string, n int) []events.Message {
		msgs := make([]events.Message, n)
		for i := range msgs {
			msgs[i] = simpleMessage(t, fmt.Sprintf("%s-%d", prefix, i), "nobody.listens")
		}
		return msgs
	}
	requireReturned := func(what string, errs []error) {
		t.Helper()
		for i, err := range errs {
			if !errors.Is(err, events.ErrReturned) {
				t.Fatalf("%s: message %d: %v, want ErrReturned", what, i, err)
			}
		}
	}

	ctx, cancel := context.WithTimeout(t.Context(), 4*waitTimeout)
	defer cancel()
	requireReturned("ten windows in one publish", p.Publish(ctx, unroutable("a", 10*window)))

	// A window's worth of returns that will come late, then as many more.
	timeOut(t, p, proxy, unroutable("late", window))
	requireReturned("after a timed-out window", p.Publish(ctx, unroutable("b", window)))
	requireConfirmed(t, "a routable message after them", p.Publish(ctx, []events.Message{simpleMessage(t, "ok", "order.created")}))
}
