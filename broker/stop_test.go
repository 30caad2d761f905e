package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestStopUnblocksStalledWrite stops the publisher while a publish is
// blocked in a socket write to a broker that stopped reading, with the
// default write timeout of 30 s: the library holds its send lock across
// that write, so a graceful close would wait behind it. Stop still
// returns within its deadline, and so does the publish, with every
// message events.ErrUnavailable.
func TestStopUnblocksStalledWrite(t *testing.T) {
	t.Parallel()
	amqpURL := testenv.AMQPURL(t)
	exchange := testenv.UniqueName(t, "ex_")
	testenv.Consume(t, amqpURL, exchange)
	proxied, proxy := testenv.Proxied(t, amqpURL)
	p, err := New(Config{URL: proxied, Exchange: exchange, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	s, err := p.readySession()
	if err != nil {
		t.Fatal(err)
	}

	proxy.Stall()
	body := bytes.Repeat([]byte("x"), 1<<20)
	msgs := make([]events.Message, 64)
	for i := range msgs {
		msgs[i] = events.Message{ID: fmt.Sprintf("big-%d", i), Type: "order.created", Timestamp: time.Now(), Body: body}
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	result := make(chan []error, 1)
	go func() { result <- p.Publish(ctx, msgs) }()

	// The wire's lock is held across each socket write: held through 20
	// polls in a row, the write is blocked, not merely slow.
	held := 0
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		if s.wire.mu.TryLock() {
			s.wire.mu.Unlock()
			held = 0
		} else {
			held++
		}
		return held >= 20, "no socket write blocked on the stalled proxy"
	})

	stopCtx, stopCancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer stopCancel()
	if err := p.Stop(stopCtx); err != nil {
		t.Fatalf("Stop during a blocked write: %v", err)
	}
	select {
	case errs := <-result:
		for i, err := range errs {
			if !errors.Is(err, events.ErrUnavailable) {
				t.Errorf("message %d: %v, want events.ErrUnavailable", i, err)
			}
		}
	case <-stopCtx.Done():
		t.Fatal("Publish still blocked after Stop returned")
	}
}
