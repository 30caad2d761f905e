package testenv

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox/internal/redact"
)

// EnvAMQPURL selects the RabbitMQ server for tests.
const EnvAMQPURL = "OUTBOX_TEST_AMQP_URL"

// AMQPURLDefault is the RabbitMQ server used when OUTBOX_TEST_AMQP_URL is
// unset.
const AMQPURLDefault = "amqp://guest:guest@127.0.0.1:5672/"

const amqpDialTimeout = 10 * time.Second

// rabbit caches the reachability check of the first AMQPURL call.
var rabbit struct {
	once sync.Once
	err  error
}

// AMQPURL returns OUTBOX_TEST_AMQP_URL or AMQPURLDefault. The first call of
// the test binary dials it once; if RabbitMQ is unreachable, every call fails
// the test naming the URL (password redacted) and how to start RabbitMQ.
func AMQPURL(t testing.TB) string {
	t.Helper()
	url := os.Getenv(EnvAMQPURL)
	if url == "" {
		url = AMQPURLDefault
	}
	rabbit.once.Do(func() { rabbit.err = checkAMQP(url) })
	if rabbit.err != nil {
		t.Fatalf("testenv: %v", rabbit.err)
	}
	return url
}

func checkAMQP(url string) error {
	conn, err := dialAMQP(url)
	if err != nil {
		return fmt.Errorf("RabbitMQ is not reachable at %s: %w\n"+
			"Start it with: rabbitmq-server -detached (install it with: apt-get install -y rabbitmq-server;\n"+
			"`rabbitmqctl status` tells whether it runs), or point %s at another server",
			redact.URL(url), err, EnvAMQPURL)
	}
	return conn.Close()
}

func dialAMQP(url string) (*amqp.Connection, error) {
	return amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(amqpDialTimeout)})
}

// Dial opens a connection of the test's own to the RabbitMQ at amqpURL,
// closed in t.Cleanup: after the cleanups registered later, which may still
// use it.
func Dial(t testing.TB, amqpURL string) *amqp.Connection {
	t.Helper()
	conn, err := dialAMQP(amqpURL)
	if err != nil {
		t.Fatalf("testenv: dial RabbitMQ at %s: %v", redact.URL(amqpURL), err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Consume declares exchange as a durable topic exchange (as the worker does)
// and an exclusive, auto-delete queue bound to it with each of keys ("#",
// every message, when there are none), and returns the queue's deliveries,
// acknowledged automatically. With keys, messages of other routing keys are
// unroutable: published with mandatory set, as the worker does, they come
// back returned.
//
// In t.Cleanup it deletes the queue, deletes the exchange if no other queue
// is bound to it, and closes the connection, which closes the returned
// channel. Start the code under test after Consume, so that its own cleanup
// (stopping publishers) runs first and it never publishes to a deleted
// exchange.
func Consume(t testing.TB, amqpURL, exchange string, keys ...string) <-chan amqp.Delivery {
	t.Helper()
	conn := Dial(t, amqpURL)
	var queue string
	t.Cleanup(func() {
		// Errors are expected here (another queue still bound, connection
		// already lost) and change nothing for the test.
		if ch, err := conn.Channel(); err == nil && queue != "" {
			if _, err := ch.QueueDelete(queue, false, false, false); err == nil {
				_ = ch.ExchangeDelete(exchange, true, false)
			}
		}
	})

	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("testenv: open AMQP channel: %v", err)
	}
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		t.Fatalf("testenv: declare exchange %q: %v", exchange, err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatalf("testenv: declare queue for exchange %q: %v", exchange, err)
	}
	queue = q.Name
	if len(keys) == 0 {
		keys = []string{"#"}
	}
	for _, key := range keys {
		if err := ch.QueueBind(q.Name, key, exchange, false, nil); err != nil {
			t.Fatalf("testenv: bind queue %q to exchange %q with %q: %v", q.Name, exchange, key, err)
		}
	}
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatalf("testenv: consume queue %q: %v", q.Name, err)
	}
	return deliveries
}
