package broker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox/broker"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// Small reconnect backoff, so that a test sees the reconnect within a
// second of Restore.
const (
	reconnectMin = 50 * time.Millisecond
	reconnectMax = 500 * time.Millisecond
)

// connLog records what OnConnected was told.
type connLog struct {
	mu  sync.Mutex
	ups []bool
}

func (l *connLog) record(up bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ups = append(l.ups, up)
}

func (l *connLog) get() []bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ups)
}

// proxiedPublisher starts a Publisher on cfg, with a fresh exchange, that
// reaches RabbitMQ through a proxy the test can cut or stall and reconnects
// within a second. A queue on a direct connection is bound to the exchange
// with keys ("#", every message, when there are none): the others are
// unroutable. It returns the queue's deliveries.
func proxiedPublisher(t *testing.T, cfg broker.Config, keys ...string) (*broker.Publisher, *testenv.Proxy, <-chan amqp.Delivery) {
	t.Helper()
	amqpURL := testenv.AMQPURL(t)
	cfg.Exchange = testenv.UniqueName(t, "ex_")
	deliveries := testenv.Consume(t, amqpURL, cfg.Exchange, keys...)
	var proxy *testenv.Proxy
	cfg.URL, proxy = testenv.Proxied(t, amqpURL)
	cfg.ReconnectMin, cfg.ReconnectMax = reconnectMin, reconnectMax
	return startPublisher(t, cfg), proxy, deliveries
}

// waitFor polls cond every 10ms until it holds or timeout passes, and
// returns how long it took.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	testenv.Eventually(t, timeout, func() (bool, string) { return cond(), what })
	return time.Since(start)
}

func messages(t *testing.T, prefix string, n int) []events.Message {
	t.Helper()
	msgs := make([]events.Message, n)
	for i := range msgs {
		msgs[i] = simpleMessage(t, fmt.Sprintf("%s-%d", prefix, i), "order.created")
	}
	return msgs
}

func requireConfirmed(t *testing.T, what string, errs []error) {
	t.Helper()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s: message %d: %v", what, i, err)
		}
	}
}

// TestPublisherReconnectsAfterCut cuts the link to RabbitMQ: the publisher
// reports itself unavailable and refuses publishes with ErrUnavailable;
// after Restore it reconnects on its own and publishes again.
func TestPublisherReconnectsAfterCut(t *testing.T) {
	t.Parallel()
	var log connLog
	p, proxy, deliveries := proxiedPublisher(t, broker.Config{OnConnected: log.record})
	ctx, cancel := context.WithTimeout(t.Context(), 4*waitTimeout)
	defer cancel()

	requireConfirmed(t, "publish before the cut", p.Publish(ctx, messages(t, "before", 3)))
	receive(t, deliveries, 3)

	proxy.Cut()
	took := waitFor(t, waitTimeout, "Ready reports the cut", func() bool { return p.Ready() != nil })
	t.Logf("Ready() failed %s after the cut: %v", took.Round(time.Millisecond), p.Ready())
	if err := p.Ready(); !errors.Is(err, events.ErrUnavailable) {
		t.Errorf("Ready during the cut = %v, want ErrUnavailable", err)
	}
	for i, err := range p.Publish(ctx, messages(t, "during", 3)) {
		if !errors.Is(err, events.ErrUnavailable) {
			t.Errorf("publish during the cut: message %d: %v, want ErrUnavailable", i, err)
		}
	}

	proxy.Restore()
	took = waitFor(t, waitTimeout, "reconnect after Restore", func() bool { return p.Ready() == nil })
	t.Logf("Ready() nil again %s after Restore (ReconnectMin %s, ReconnectMax %s)", took.Round(time.Millisecond), reconnectMin, reconnectMax)
	requireConfirmed(t, "publish after Restore", p.Publish(ctx, messages(t, "after", 3)))

	// The next deliveries are the three of after Restore: nothing published
	// during the cut slipped through.
	got := receive(t, deliveries, 3)
	for i := range 3 {
		if _, ok := got[fmt.Sprintf("after-%d", i)]; !ok {
			t.Errorf("after-%d not delivered; got %v", i, keys(got))
		}
	}
	if !slices.Equal(log.get(), []bool{true, false, true}) {
		t.Errorf("OnConnected calls = %v, want [true false true]", log.get())
	}
}

// TestPublishCutMidBatch cuts the link while a large Publish is waiting for
// its confirms. Each message is either confirmed (and then delivered) or
// fails with ErrUnavailable: a lost connection must never pass for a nack
// or a return, which would cost the event an attempt.
func TestPublishCutMidBatch(t *testing.T) {
	t.Parallel()
	p, proxy, deliveries := proxiedPublisher(t, broker.Config{})
	ctx, cancel := context.WithTimeout(t.Context(), 4*waitTimeout)
	defer cancel()

	const n = 20_000
	msgs := messages(t, "m", n)
	result := make(chan []error, 1)
	go func() { result <- p.Publish(ctx, msgs) }()

	// Cut as soon as the first message arrives: the publish is under way.
	delivered := map[string]int{}
	select {
	case d := <-deliveries:
		proxy.Cut()
		delivered[d.MessageId]++
	case <-ctx.Done():
		t.Fatal("no delivery before the cut")
	}
	var errs []error
	select {
	case errs = <-result:
	case <-ctx.Done():
		t.Fatal("Publish did not return after the cut")
	}

	confirmed, unavailable := 0, 0
	for i, err := range errs {
		switch {
		case err == nil:
			confirmed++
		case errors.Is(err, events.ErrUnavailable) || errors.Is(err, events.ErrUnconfirmed):
			unavailable++
		default:
			t.Errorf("message %d: %v, want nil or ErrUnavailable", i, err)
		}
	}
	t.Logf("cut mid-publish: %d of %d confirmed, %d unavailable", confirmed, n, unavailable)
	if unavailable == 0 {
		t.Errorf("no message failed: the cut came after the whole publish, so this run tested nothing")
	}

	// Every confirmed message is in the queue: read until each has come.
	var missing []string
	for i, err := range errs {
		if err == nil && delivered[msgs[i].ID] == 0 {
			missing = append(missing, msgs[i].ID)
		}
	}
	for id, n := range testenv.Receive(t, deliveries, missing, waitTimeout) {
		delivered[id] += n
	}

	proxy.Restore()
	waitFor(t, waitTimeout, "reconnect after Restore", func() bool { return p.Ready() == nil })
	requireConfirmed(t, "publish after Restore", p.Publish(ctx, messages(t, "after", 1)))
}
