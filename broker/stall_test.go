package broker_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/broker"
	"github.com/outboxrelay/outbox/events"
)

// largeMessages are n messages of 1 MiB each: a window of them is far more
// than the socket buffers between the publisher and a stalled proxy hold.
func largeMessages(prefix string, n int) []events.Message {
	body := bytes.Repeat([]byte("x"), 1<<20)
	msgs := make([]events.Message, n)
	for i := range msgs {
		msgs[i] = events.Message{ID: fmt.Sprintf("%s-%d", prefix, i), Type: "order.created", Timestamp: time.Now(), Body: body}
	}
	return msgs
}

// TestPublishToStalledBroker publishes a window of large messages to a
// broker that keeps the connection open but has stopped reading. The
// blocked socket write fails at the write timeout, long before the
// publish's own deadline: every message is ErrUnavailable, and Stop
// returns, although the reconnect it interrupts is stalled too.
func TestPublishToStalledBroker(t *testing.T) {
	t.Parallel()
	p, proxy, _ := proxiedPublisher(t, broker.Config{WriteTimeout: 500 * time.Millisecond})

	proxy.Stall()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	errs := p.Publish(ctx, largeMessages("big", 32))
	if ctx.Err() != nil {
		t.Fatalf("Publish returned only when its context ended: the blocked write had no deadline")
	}
	for i, err := range errs {
		if !errors.Is(err, events.ErrUnavailable) {
			t.Errorf("message %d: %v, want ErrUnavailable", i, err)
		}
	}
	t.Logf("first error: %v", errs[0])

	stopCtx, stopCancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer stopCancel()
	if err := p.Stop(stopCtx); err != nil {
		t.Errorf("Stop with the broker stalled: %v", err)
	}
}
