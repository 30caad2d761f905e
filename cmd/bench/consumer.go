package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// consumer is a real consumer of the worker's exchange: an exclusive queue
// bound with "#" that notes when each message id first arrived and how
// many times.
type consumer struct {
	conn     *amqp.Connection
	exchange string

	mu       sync.Mutex
	first    map[string]time.Time
	order    []string // message ids in order of first delivery
	last     time.Time
	count    int // deliveries, duplicates included
	wantN    int
	reached  chan struct{}
	finished chan struct{}
}

// newConsumer declares exchange as the worker does and starts consuming.
func newConsumer(amqpURL, exchange string) (*consumer, error) {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return nil, fmt.Errorf("dial RabbitMQ: %w", err)
	}
	c := &consumer{conn: conn, exchange: exchange, first: map[string]time.Time{}, finished: make(chan struct{})}
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
	go c.loop(deliveries)
	return c, nil
}

func (c *consumer) loop(deliveries <-chan amqp.Delivery) {
	defer close(c.finished)
	for d := range deliveries {
		now := time.Now()
		c.mu.Lock()
		c.count++
		if _, seen := c.first[d.MessageId]; !seen {
			c.first[d.MessageId] = now
			c.order = append(c.order, d.MessageId)
			c.last = now
			if c.reached != nil && len(c.first) >= c.wantN {
				close(c.reached)
				c.reached = nil
			}
		}
		c.mu.Unlock()
	}
}

// waitFor waits until n distinct messages have arrived, or timeout.
func (c *consumer) waitFor(ctx context.Context, n int, timeout time.Duration) error {
	c.mu.Lock()
	if len(c.first) >= n {
		c.mu.Unlock()
		return nil
	}
	reached := make(chan struct{})
	c.reached, c.wantN = reached, n
	c.mu.Unlock()
	select {
	case <-reached:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(timeout):
		c.mu.Lock()
		got := len(c.first)
		c.reached = nil
		c.mu.Unlock()
		return fmt.Errorf("received %d distinct events of %d within %s", got, n, timeout)
	}
}

// snapshot returns the first arrival of each id and the delivery count.
func (c *consumer) snapshot() (map[string]time.Time, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	first := make(map[string]time.Time, len(c.first))
	for id, t := range c.first {
		first[id] = t
	}
	return first, c.count
}

// firstOrder returns the message ids in order of first delivery (one
// queue, one consumer: the order the queue held them in), and when the
// last new one arrived.
func (c *consumer) firstOrder() ([]string, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.order...), c.last
}

// close deletes the exchange (the queue goes with the connection).
func (c *consumer) close() {
	if ch, err := c.conn.Channel(); err == nil {
		_ = ch.ExchangeDelete(c.exchange, false, false)
	}
	_ = c.conn.Close()
	<-c.finished
}
