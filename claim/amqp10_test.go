package claim

import (
	"context"
	"net/url"
	"testing"

	goamqp "github.com/Azure/go-amqp"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// consumeAMQP10 binds a queue of its own to exchange and returns an AMQP
// 1.0 receiver on it, through RabbitMQ's AMQP 1.0 plugin
// (rabbitmq_amqp1_0, which scripts/servers.sh enables): the way an AMQP
// 1.0 consumer, such as sdk-go's AMQP binding, reads what the relay
// publishes over AMQP 0-9-1.
func consumeAMQP10(t *testing.T, exchange string) *goamqp.Receiver {
	t.Helper()
	amqpURL := testenv.AMQPURL(t)
	conn := testenv.Dial(t, amqpURL)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	queue := testenv.UniqueName(t, "amqp10_")
	if err := ch.ExchangeDeclare(exchange, "topic", true, false, false, false, nil); err != nil {
		t.Fatalf("declare exchange %s: %v", exchange, err)
	}
	if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		t.Fatalf("declare queue %s: %v", queue, err)
	}
	t.Cleanup(func() { _, _ = ch.QueueDelete(queue, false, false, false) })
	if err := ch.QueueBind(queue, "#", exchange, false, nil); err != nil {
		t.Fatalf("bind queue %s: %v", queue, err)
	}

	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	password, _ := u.User.Password()
	client, err := goamqp.Dial("amqp://"+u.Host, goamqp.ConnSASLPlain(u.User.Username(), password))
	if err != nil {
		t.Fatalf("AMQP 1.0 connection to %s: %v (is RabbitMQ's AMQP 1.0 plugin on? rabbitmq-plugins enable rabbitmq_amqp1_0)", u.Host, err)
	}
	t.Cleanup(func() { _ = client.Close() })
	session, err := client.NewSession()
	if err != nil {
		t.Fatalf("AMQP 1.0 session: %v", err)
	}
	receiver, err := session.NewReceiver(goamqp.LinkSourceAddress("/amq/queue/"+queue), goamqp.LinkCredit(10))
	if err != nil {
		t.Fatalf("AMQP 1.0 receiver on %s: %v", queue, err)
	}
	// No receiver.Close: RabbitMQ 3.10's plugin does not answer a detach,
	// so it would wait out its context; closing the connection ends the
	// link with it.
	return receiver
}

// receiveAMQP10 returns the next n messages of r, failing the test when
// they do not come within waitFor.
func receiveAMQP10(t *testing.T, r *goamqp.Receiver, n int) []*goamqp.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitFor)
	defer cancel()
	var got []*goamqp.Message
	for len(got) < n {
		m, err := r.Receive(ctx)
		if err != nil {
			t.Fatalf("received %d AMQP 1.0 messages of %d: %v", len(got), n, err)
		}
		got = append(got, m)
	}
	return got
}
