package main

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestParseConfigMongo(t *testing.T) {
	t.Parallel()
	env := map[string]string{"OUTBOX_MONGO_URI": "mongodb://db:27017/?replicaSet=rs0", "CONSUMER_INBOX_COLLECTION": "orders_inbox"}
	c, err := parseConfig(nil, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if c.MongoURI != env["OUTBOX_MONGO_URI"] || c.InboxCollection != "orders_inbox" || c.Database != "outbox" {
		t.Errorf("config = %+v, want the environment's URI and collection, database outbox", c)
	}
	_, err = parseConfig([]string{"--mongo-uri", "http://user:secret@db/"}, func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "OUTBOX_MONGO_URI") || strings.Contains(err.Error(), "secret") {
		t.Errorf("bad URI: error %v, want one naming OUTBOX_MONGO_URI without the password", err)
	}
}

func TestQueueArgs(t *testing.T) {
	t.Parallel()
	c, err := parseConfig(nil, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	// A new name: the old demo queue exists without single active consumer
	// wherever make dev ran before, and cannot be redeclared with it.
	if c.Queue != "outbox-demo-ordered" {
		t.Errorf("default queue = %q, want outbox-demo-ordered", c.Queue)
	}
	tests := []struct {
		expires time.Duration
		want    amqp.Table
	}{
		{0, amqp.Table{"x-single-active-consumer": true}},
		{15 * time.Minute, amqp.Table{"x-single-active-consumer": true, "x-expires": int64(900000)}},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, queueArgs(tt.expires)); diff != "" {
			t.Errorf("queueArgs(%s) (-want +got):\n%s", tt.expires, diff)
		}
	}
}

// TestSingleActiveConsumer: with the demo queue's arguments, a second
// consumer of the queue gets nothing while the first is attached, so the
// queue's order is the order one handler sees.
func TestSingleActiveConsumer(t *testing.T) {
	t.Parallel()
	conn := testenv.Dial(t, testenv.AMQPURL(t))
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare(testenv.UniqueName(t, "sac_"), false, true, false, false, queueArgs(time.Minute))
	if err != nil {
		t.Fatalf("declare with %v: %v", queueArgs(time.Minute), err)
	}
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(q.Name, false, false, false)
		}
	})
	consumers := make([]<-chan amqp.Delivery, 2)
	for i := range consumers {
		c, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if consumers[i], err = c.Consume(q.Name, "", true, false, false, false, nil); err != nil {
			t.Fatalf("consumer %d: %v", i, err)
		}
	}
	const n = 50
	for i := range n {
		if err := ch.PublishWithContext(t.Context(), "", q.Name, false, false, amqp.Publishing{MessageId: strconv.Itoa(i)}); err != nil {
			t.Fatal(err)
		}
	}
	timeout := time.After(30 * time.Second)
	for i := range n {
		select {
		case d := <-consumers[0]:
			if d.MessageId != strconv.Itoa(i) {
				t.Fatalf("active consumer got message %s at position %d", d.MessageId, i)
			}
		case d := <-consumers[1]:
			t.Fatalf("second consumer got message %s while the first was attached", d.MessageId)
		case <-timeout:
			t.Fatalf("active consumer got %d of %d messages", i, n)
		}
	}
}
