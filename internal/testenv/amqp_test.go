package testenv

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestConsumeReceivesPublish(t *testing.T) {
	t.Parallel()
	url := AMQPURL(t)
	exchange := UniqueName(t, "ex_")
	deliveries := Consume(t, url, exchange)

	ch, err := Dial(t, url).Channel()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err = ch.PublishWithContext(ctx, exchange, "order.created", false, false, amqp.Publishing{
		ContentType: "application/json",
		MessageId:   "evt-1",
		Body:        []byte(`{"id":1}`),
	})
	if err != nil {
		t.Fatalf("publish: %v", err)
	}

	select {
	case d, ok := <-deliveries:
		if !ok {
			t.Fatal("deliveries closed before the message arrived")
		}
		if d.RoutingKey != "order.created" || d.MessageId != "evt-1" || string(d.Body) != `{"id":1}` {
			t.Errorf("delivery = key %q id %q body %q, want order.created evt-1 {\"id\":1}", d.RoutingKey, d.MessageId, d.Body)
		}
	case <-ctx.Done():
		t.Fatal("no delivery within 10s")
	}
}

// TestConsumeBindsKeys: a queue bound with keys gets their messages; a
// message of any other key is returned as unroutable.
func TestConsumeBindsKeys(t *testing.T) {
	t.Parallel()
	url := AMQPURL(t)
	exchange := UniqueName(t, "ex_")
	deliveries := Consume(t, url, exchange, "order.created")

	ch, err := Dial(t, url).Channel()
	if err != nil {
		t.Fatal(err)
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, key := range []string{"nobody.listens", "order.created"} {
		if err := ch.PublishWithContext(ctx, exchange, key, true, false, amqp.Publishing{MessageId: key}); err != nil {
			t.Fatalf("publish %s: %v", key, err)
		}
	}
	for range 2 {
		select {
		case r := <-returns:
			if r.MessageId != "nobody.listens" {
				t.Errorf("returned %q, want only nobody.listens", r.MessageId)
			}
		case d := <-deliveries:
			if d.MessageId != "order.created" {
				t.Errorf("delivered %q, want only order.created", d.MessageId)
			}
		case <-ctx.Done():
			t.Fatal("no return and delivery within 10s")
		}
	}
}

func TestCheckAMQPUnreachable(t *testing.T) {
	t.Parallel()
	err := checkAMQP("amqp://guest:secret@127.0.0.1:1/")
	if err == nil {
		t.Fatal("checkAMQP on a closed port: no error")
	}
	msg := err.Error()
	for _, want := range []string{"127.0.0.1:1", "rabbitmq-server -detached", EnvAMQPURL} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not mention %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "secret") {
		t.Errorf("error leaks the password:\n%s", msg)
	}
}
