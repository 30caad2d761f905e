package events_test

import (
	"maps"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel/attribute"

	"github.com/outboxrelay/outbox/events"
)

// TestMessagingSpanAttributes compares the attributes of the relay's and
// the inbox's spans with the RabbitMQ semantic conventions (semconv
// v1.43.0, docs/messaging/rabbitmq.md): messaging.destination.name is
// {exchange}:{routing key} for a producer, only the one present when one
// is empty, amq.default for the default exchange without a routing key;
// {exchange}:{routing key}:{queue} for a consumer, the empty ones left
// out, and one of routing key and queue when they are equal. The routing
// key is set only when not empty; server.address and server.port when
// known.
func TestMessagingSpanAttributes(t *testing.T) {
	t.Parallel()
	publish := func(exchange, key string) events.MessagingSpan {
		return events.MessagingSpan{Operation: events.OperationPublish, Exchange: exchange, RoutingKey: key, MessageID: "m", BodySize: 10}
	}
	process := func(exchange, key, queue string) events.MessagingSpan {
		return events.MessagingSpan{Operation: events.OperationProcess, Exchange: exchange, RoutingKey: key, Queue: queue, MessageID: "m", BodySize: 10}
	}
	// The conventions' examples of messaging.destination.name, and what
	// else each case must have besides the attributes of every span.
	for name, tt := range map[string]struct {
		span        events.MessagingSpan
		destination string
		more        map[string]any
	}{
		"producer: exchange and routing key":     {publish("direct_logs", "warning"), "direct_logs:warning", map[string]any{"messaging.rabbitmq.destination.routing_key": "warning"}},
		"producer: exchange only":                {publish("logs", ""), "logs", nil},
		"producer: the default exchange":         {publish("", "orders"), "orders", map[string]any{"messaging.rabbitmq.destination.routing_key": "orders"}},
		"producer: neither":                      {publish("", ""), "amq.default", nil},
		"consumer: exchange, routing key, queue": {process("direct_logs", "warning", "audit"), "direct_logs:warning:audit", map[string]any{"messaging.rabbitmq.destination.routing_key": "warning"}},
		"consumer: default exchange, key=queue":  {process("", "orders", "orders"), "orders", map[string]any{"messaging.rabbitmq.destination.routing_key": "orders"}},
		"consumer: exchange, key=queue":          {process("shop", "orders", "orders"), "shop:orders", map[string]any{"messaging.rabbitmq.destination.routing_key": "orders"}},
		"consumer: no queue known":               {process("shop", "orders", ""), "shop:orders", map[string]any{"messaging.rabbitmq.destination.routing_key": "orders"}},
	} {
		opType := "send"
		if tt.span.Operation == events.OperationProcess {
			opType = "process"
		}
		want := map[string]any{
			"messaging.system": "rabbitmq", "messaging.destination.name": tt.destination,
			"messaging.operation.name": tt.span.Operation, "messaging.operation.type": opType,
			"messaging.message.id": "m", "messaging.message.body.size": int64(10),
		}
		maps.Copy(want, tt.more)
		if diff := cmp.Diff(want, attributes(tt.span)); diff != "" {
			t.Errorf("%s: attributes (-want +got):\n%s", name, diff)
		}
	}
	// server.address and server.port when the broker is known.
	span := publish("shop", "orders")
	span.Server = "[::1]:5671"
	got := attributes(span)
	if got["server.address"] != "::1" || got["server.port"] != int64(5671) {
		t.Errorf("server attributes %v, %v; want ::1 and 5671", got["server.address"], got["server.port"])
	}
}

// attributes are s's attributes by key.
func attributes(s events.MessagingSpan) map[string]any {
	got := map[string]any{}
	for _, kv := range s.Attributes() {
		got[string(kv.Key)] = attributeValue(kv.Value)
	}
	return got
}

func attributeValue(v attribute.Value) any {
	if v.Type() == attribute.INT64 {
		return v.AsInt64()
	}
	return v.AsString()
}

func TestBrokerServer(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ url, want string }{
		{"amqp://guest:secret@rabbit.example:5673/vhost", "rabbit.example:5673"},
		{"amqp://rabbit.example", "rabbit.example:5672"},
		{"amqps://user:pw@rabbit.example/", "rabbit.example:5671"},
		{"amqp://[::1]/", "[::1]:5672"},
		{"not a url", ""},
	} {
		if got := events.BrokerServer(tt.url); got != tt.want {
			t.Errorf("BrokerServer(%q) = %q, want %q", tt.url, got, tt.want)
		}
	}
}
