package main

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox/internal/tally"
)

// consumer is a real consumer of the worker's exchange: an exclusive queue
// bound with "#" that notes when each message id first arrived and how
// many times.
type consumer struct {
	*tally.Tally
	conn     *amqp.Connection
	exchange string
	finished <-chan struct{}
}

// newConsumer declares exchange as the worker does and starts consuming.
func newConsumer(amqpURL, exchange string) (*consumer, error) {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return nil, fmt.Errorf("dial RabbitMQ: %w", err)
	}
	c := &consumer{Tally: tally.New(), conn: conn, exchange: exchange}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("declare exchange %s: %w", exchange, err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err == nil {
		err = ch.QueueBind(q.Name, "#", exchange, false, nil)
	}
	var deliveries <-chan amqp.Delivery
	if err == nil {
		deliveries, err = ch.Consume(q.Name, "", true, true, false, false, nil) // auto-ack
	}
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("consume from %s: %w", exchange, err)
	}
	c.finished = c.Consume(deliveries)
	return c, nil
}

// waitFor waits until n distinct messages have arrived, or timeout.
func (c *consumer) waitFor(ctx context.Context, n int, timeout time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := c.WaitDistinct(wctx, n); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		got, _, _ := c.Snapshot()
		return fmt.Errorf("received %d distinct events of %d within %s", got, n, timeout)
	}
	return nil
}

// snapshot returns the first arrival of each id and the delivery count.
func (c *consumer) snapshot() (map[string]time.Time, int) {
	_, total, _ := c.Snapshot()
	return c.FirstArrivals(), total
}

// close deletes the exchange (the queue goes with the connection).
func (c *consumer) close() {
	if ch, err := c.conn.Channel(); err == nil {
		_ = ch.ExchangeDelete(c.exchange, false, false)
	}
	_ = c.conn.Close()
	<-c.finished
}
