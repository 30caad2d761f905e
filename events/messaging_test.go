package events_test

import (
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
	for name, tt := range map[string]struct {
		span events.MessagingSpan
		want map[string]any
	}{
		"producer: exchange and routing key": {
			events.MessagingSpan{Operation: events.OperationPublish, Exchange: "direct_logs", RoutingKey: "warning", MessageID: "m1", BodySize: 10, Server: "rabbit.example:5672"},
			map[string]any{
				"messaging.system": "rabbitmq", "messaging.destination.name": "direct_logs:warning",
				"messaging.operation.name": "publish", "messaging.operation.type": "send",
				"messaging.rabbitmq.destination.routing_key": "warning", "messaging.message.id": "m1",
				"messaging.message.body.size": int64(10), "server.address": "rabbit.example", "server.port": int64(5672),
			},
		},
		"producer: exchange only": {
			events.MessagingSpan{Operation: events.OperationPublish, Exchange: "logs", MessageID: "m2"},
			map[string]any{
				"messaging.system": "rabbitmq", "messaging.destination.name": "logs",
				"messaging.operation.name": "publish", "messaging.operation.type": "send",
				"messaging.message.id": "m2", "messaging.message.body.size": int64(0),
			},
		},
		"producer: the default exchange": {
			events.MessagingSpan{Operation: events.OperationPublish, RoutingKey: "orders", MessageID: "m3"},
			map[string]any{
				"messaging.system": "rabbitmq", "messaging.destination.name": "orders",
				"messaging.operation.name": "publish", "messaging.operation.type": "send",
				"messaging.rabbitmq.destination.routing_key": "orders", "messaging.message.id": "m3", "messaging.message.body.size": int64(0),
			},
		},
		"producer: neither": {
			events.MessagingSpan{Operation: events.OperationPublish, MessageID: "m4"},
			map[string]any{
				"messaging.system": "rabbitmq", "messaging.destination.name": "amq.default",
				"messaging.operation.name": "publish", "messaging.operation.type": "send",
				"messaging.message.id": "m4", "messaging.message.body.size": int64(0),
			},
		},
		"consumer: exchange, routing key and queue": {
			events.MessagingSpan{Operation: events.OperationProcess, Exchange: "direct_logs", RoutingKey: "warning", Queue: "audit", MessageID: "m5", Server: "[::1]:5671"},
			map[string]any{
				"messaging.system": "rabbitmq", "messaging.destination.name": "direct_logs:warning:audit",
				"messaging.operation.name": "process", "messaging.operation.type": "process",
				"messaging.rabbitmq.destination.routing_key": "warning", "messaging.message.id": "m5",
				"messaging.message.body.size": int64(0), "server.address": "::1", "server.port": int64(5671),
			},
		},
		"consumer: the default exchange, routing key the queue": {
			events.MessagingSpan{Operation: events.OperationProcess, RoutingKey: "orders", Queue: "orders", MessageID: "m6"},
			map[string]any{
				"messaging.system": "rabbitmq", "messaging.destination.name": "orders",
				"messaging.operation.name": "process", "messaging.operation.type": "process",
				"messaging.rabbitmq.destination.routing_key": "orders", "messaging.message.id": "m6", "messaging.message.body.size": int64(0),
			},
		},
		"consumer: an exchange and a routing key equal to the queue": {
			events.MessagingSpan{Operation: events.OperationProcess, Exchange: "shop", RoutingKey: "orders", Queue: "orders", MessageID: "m7"},
			map[string]any{
				"messaging.system": "rabbitmq", "messaging.destination.name": "shop:orders",
				"messaging.operation.name": "process", "messaging.operation.type": "process",
				"messaging.rabbitmq.destination.routing_key": "orders", "messaging.message.id": "m7", "messaging.message.body.size": int64(0),
			},
		},
	} {
		got := map[string]any{}
		for _, kv := range tt.span.Attributes() {
			got[string(kv.Key)] = attributeValue(kv.Value)
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%s: attributes (-want +got):\n%s", name, diff)
		}
	}
}

func attributeValue(v attribute.Value) any {
	if v.Type() == attribute.INT64 {
		return v.AsInt64()
	}
	return v.AsString()
}

func TestBrokerServer(t *testing.T) {
	t.Parallel()
	for url, want := range map[string]string{
		"amqp://guest:secret@rabbit.example:5673/vhost": "rabbit.example:5673",
		"amqp://rabbit.example":                         "rabbit.example:5672",
		"amqps://user:pw@rabbit.example/":               "rabbit.example:5671",
		"amqp://[::1]/":                                 "[::1]:5672",
		"not a url":                                     "",
	} {
		if got := events.BrokerServer(url); got != want {
			t.Errorf("BrokerServer(%q) = %q, want %q", url, got, want)
		}
	}
}
