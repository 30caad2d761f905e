package main

import (
	"github.com/outboxrelay/outbox/internal/tally"

	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// orderReceiver is one consumer of one queue, whose delivery order is the
// order the queue holds: it notes each message id's first position.
type orderReceiver struct {
	*receiver
	queue, exchange string
	ctl             *amqp.Channel // declares and binds; deliveries use another
}

// consumeOrdered declares exchange as the worker does, an exclusive queue
// bound to it with keys, and consumes the queue with one consumer. Call it
// before starting workers.
func consumeOrdered(t *testing.T, s stack, exchange string, keys ...string) *orderReceiver {
	t.Helper()
	conn, err := amqp.Dial(s.amqpURL)
	if err != nil {
		t.Fatalf("dial RabbitMQ: %v", err)
	}
	r := &orderReceiver{receiver: &receiver{tally.New()}, exchange: exchange}
	var done <-chan struct{}
	// Cleanups run last-registered first: workers (started after this)
	// stop before the queue and exchange go.
	t.Cleanup(func() {
		if r.ctl != nil && r.queue != "" {
			if _, err := r.ctl.QueueDelete(r.queue, false, false, false); err == nil {
				_ = r.ctl.ExchangeDelete(exchange, true, false)
			}
		}
		_ = conn.Close()
		if done != nil {
			<-done
		}
	})
	if r.ctl, err = conn.Channel(); err != nil {
		t.Fatalf("open AMQP channel: %v", err)
	}
	if err := r.ctl.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		t.Fatalf("declare exchange %q: %v", exchange, err)
	}
	q, err := r.ctl.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatalf("declare queue: %v", err)
	}
	r.queue = q.Name
	for _, k := range keys {
		r.bind(t, k)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("open AMQP channel: %v", err)
	}
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatalf("consume queue %q: %v", q.Name, err)
	}
	done = r.Consume(deliveries)
	return r
}

// bind binds the queue to the exchange with key.
func (r *orderReceiver) bind(t *testing.T, key string) {
	t.Helper()
	if err := r.ctl.QueueBind(r.queue, key, r.exchange, false, nil); err != nil {
		t.Fatalf("bind queue %q to %q with %q: %v", r.queue, r.exchange, key, err)
	}
}

// arrived returns the message ids received so far, in order of first
// arrival.
func (r *orderReceiver) arrived() []string {
	order, _ := r.Order()
	return order
}

// firstArrivals maps each message id to the position of its first
// delivery among all deliveries.
func (r *orderReceiver) firstArrivals() map[string]int { return r.FirstPositions() }

// duplicates returns the ids delivered more than once, with their counts.
func (r *orderReceiver) duplicates() map[string]int {
	out := map[string]int{}
	for id, c := range r.Counts() {
		if c > 1 {
			out[id] = c
		}
	}
	return out
}
