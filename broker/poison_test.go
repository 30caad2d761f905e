package broker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/broker"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// ccPoison is a message RabbitMQ refuses: its CC header (extra routing
// keys) is a string, not an array, so the broker closes the channel with 406
// PRECONDITION_FAILED - invalid message: {unacceptable_type_in_header,"CC",longstr}.
// events.NewMessage refuses such a document, so the header is set on the
// message afterwards: this stands for any message the broker closes the
// channel over that no check before publishing foresaw.
func ccPoison(t *testing.T, id string) events.Message {
	t.Helper()
	m := message(t, bson.D{
		{Key: "_id", Value: id},
		{Key: "type", Value: "order.created"},
		{Key: "payload", Value: bson.D{{Key: "id", Value: id}}},
		{Key: "status", Value: "NEW"},
		{Key: "createdAt", Value: time.Now()},
	})
	m.Headers = map[string]any{"CC": "audit"}
	return m
}

// publishIsolating publishes msgs in one call to a fresh exchange, and
// checks that each message at an index in bad fails alone as
// events.ErrRejected, which checkBad examines further, while every other
// message is confirmed and delivered and no bad one is (a message
// republished after a close may come twice). It returns the publisher and
// what Publish returned.
func publishIsolating(t *testing.T, msgs []events.Message, bad map[int]bool, checkBad func(i int, err error)) (*broker.Publisher, []error) {
	t.Helper()
	url := testenv.AMQPURL(t)
	exchange := testenv.UniqueName(t, "ex_")
	deliveries := testenv.Consume(t, url, exchange)
	p := startPublisher(t, broker.Config{URL: url, Exchange: exchange, ReconnectMin: reconnectMin, ReconnectMax: reconnectMax})
	ctx, cancel := context.WithTimeout(t.Context(), 4*waitTimeout)
	defer cancel()
	errs := p.Publish(ctx, msgs)

	var want []string
	never := map[string]bool{}
	for i, err := range errs {
		switch {
		case !bad[i]:
			if err != nil {
				t.Errorf("message %d: %v, want confirmed: only the bad messages may fail", i, err)
			}
			want = append(want, msgs[i].ID)
		case !errors.Is(err, events.ErrRejected):
			never[msgs[i].ID] = true
			t.Errorf("bad message %d: %v, want ErrRejected", i, err)
		default:
			never[msgs[i].ID] = true
			checkBad(i, err)
		}
	}
	for id := range testenv.Receive(t, deliveries, want, waitTimeout) {
		if never[id] {
			t.Errorf("message %q was delivered; it should have been rejected", id)
		}
	}
	return p, errs
}

// TestPublishIsolatesPoison publishes a window in which two messages make
// RabbitMQ close the channel. Each fails alone as ErrRejected carrying the
// broker's code and reason; every other message is confirmed and
// delivered; and the publisher goes on publishing.
func TestPublishIsolatesPoison(t *testing.T) {
	t.Parallel()
	const n = 200
	poison := map[int]bool{20: true, 150: true}
	msgs := make([]events.Message, n)
	for i := range msgs {
		id := fmt.Sprintf("m-%d", i)
		if poison[i] {
			msgs[i] = ccPoison(t, id)
		} else {
			msgs[i] = simpleMessage(t, id, "order.created")
		}
	}
	p, errs := publishIsolating(t, msgs, poison, func(i int, err error) {
		var amqpErr *amqp.Error
		if !errors.As(err, &amqpErr) || amqpErr.Code != amqp.PreconditionFailed || !amqpErr.Server {
			t.Errorf("poison message %d: %v, want it to wrap the broker's 406 close", i, err)
		}
		if !strings.Contains(err.Error(), "unacceptable_type_in_header") {
			t.Errorf("poison message %d: %q does not carry the broker's reason", i, err)
		}
	})
	t.Logf("poison: %v", errs[20])

	waitFor(t, waitTimeout, "ready after isolating the poison", func() bool { return p.Ready() == nil })
	ctx, cancel := context.WithTimeout(t.Context(), 4*waitTimeout)
	defer cancel()
	requireConfirmed(t, "publish after the poison", p.Publish(ctx, messages(t, "after", 3)))
}

// TestPublishIsolatesClientRefusal publishes, in a window, a message the
// AMQP client refuses to encode (a message_id over 255 bytes, built by hand
// past events.NewMessage's check): the client closes the connection, the
// message fails alone as ErrRejected, and the others are confirmed.
func TestPublishIsolatesClientRefusal(t *testing.T) {
	t.Parallel()
	msgs := messages(t, "m", 20)
	msgs[5].ID = strings.Repeat("x", 300)
	_, errs := publishIsolating(t, msgs, map[int]bool{5: true}, func(_ int, err error) {
		if !strings.Contains(err.Error(), "client") {
			t.Errorf("message with a 300-byte id: %v, want ErrRejected by the client", err)
		}
	})
	t.Logf("refused: %.200s", errs[5])
}

// TestPublishOutageIsNotPoison cuts the link while a window waits for its
// confirms: nothing is rejected, and what is unconfirmed is ErrUnavailable
// (or ErrUnconfirmed), as before isolation existed.
func TestPublishOutageIsNotPoison(t *testing.T) {
	t.Parallel()
	p, proxy, deliveries := proxiedPublisher(t, broker.Config{})
	ctx, cancel := context.WithTimeout(t.Context(), 4*waitTimeout)
	defer cancel()

	msgs := messages(t, "m", 5000)
	result := make(chan []error, 1)
	go func() { result <- p.Publish(ctx, msgs) }()
	select {
	case <-deliveries:
		proxy.Cut()
	case <-ctx.Done():
		t.Fatal("no delivery before the cut")
	}
	errs := <-result
	failed := 0
	for i, err := range errs {
		switch {
		case err == nil:
		case errors.Is(err, events.ErrUnavailable) || errors.Is(err, events.ErrUnconfirmed):
			failed++
		default:
			t.Errorf("message %d: %v, want nil, ErrUnavailable or ErrUnconfirmed", i, err)
		}
	}
	if failed == 0 {
		t.Errorf("no message failed: the cut came after the whole publish, so this run tested nothing")
	}
}
