package events

import "strings"

// Headers that RabbitMQ (or one of its plugins) writes on a message itself.
// Consumers read them as the broker's word: the inbox takes x-delivery-count
// as a quorum queue's count of deliveries, dead-letter consumers read
// x-death and x-first-death-* to learn where and why a message died, and
// federation reads x-received-from to break cycles. A producer that could
// set them could forge that word (x-delivery-count: 99 makes a consumer
// dead-letter a message at its first handler error; x-delivery-count: 0
// keeps a poison message looping), so an event that carries one is poison.
//
// The list, with who writes each header:
//   - dead lettering: x-death, x-first-death-exchange, -queue, -reason and
//     x-last-death-exchange, -queue, -reason (any x-first-death-* or
//     x-last-death-* name is refused, for names later versions add);
//   - quorum queues: x-delivery-count, on every redelivery;
//   - streams: x-stream-offset, on every delivery to an AMQP 0-9-1 consumer;
//   - federation: x-received-from, one entry per hop;
//   - shovel: x-shovelled and x-shovelled-timestamp;
//   - the MQTT plugin: x-mqtt-publish-qos, and x-mqtt-dup up to 3.11 (its
//     MQTT subscribers read it as the duplicate flag);
//   - AMQP 1.0 messages seen by AMQP 0-9-1 clients: x-amqp-1.0-* (any).
//
// Names compare without regard to case: RabbitMQ reads only the lower-case
// spelling, but consumer libraries and people reading headers need not.
//
// CC and BCC are not in the list: RabbitMQ interprets them (extra routing
// keys) but they are the sender's to choose; headerTable checks their type.
var brokerHeaders = map[string]string{
	"x-death":               "dead lettering",
	"x-delivery-count":      "quorum queues",
	"x-stream-offset":       "streams",
	"x-received-from":       "federation",
	"x-shovelled":           "the shovel plugin",
	"x-shovelled-timestamp": "the shovel plugin",
	"x-mqtt-publish-qos":    "the MQTT plugin",
	"x-mqtt-dup":            "the MQTT plugin",
}

// brokerHeaderPrefixes are families of broker-owned names, with who writes
// them.
var brokerHeaderPrefixes = []struct{ prefix, owner string }{
	{"x-first-death-", "dead lettering"},
	{"x-last-death-", "dead lettering"},
	{"x-amqp-1.0-", "the AMQP 1.0 conversion"},
}

// BrokerHeader reports whether name is a header RabbitMQ sets on messages
// itself, and which part of RabbitMQ sets it. Events must not carry one.
func BrokerHeader(name string) (owner string, ok bool) {
	lower := strings.ToLower(name)
	if owner, ok := brokerHeaders[lower]; ok {
		return owner, true
	}
	for _, p := range brokerHeaderPrefixes {
		if strings.HasPrefix(lower, p.prefix) {
			return p.owner, true
		}
	}
	return "", false
}
