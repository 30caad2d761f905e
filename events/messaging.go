package events

import (
	"net"
	"net/url"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// Messaging operations of the relay's and the inbox's spans, as
// MessagingSpan.Operation: OpenTelemetry's messaging.operation.name (the
// AMQP method's name for a publish) and, for the two, also its type.
const (
	OperationPublish = "publish"
	OperationProcess = "process"
)

// MessagingSpan describes a span of one message on RabbitMQ in the terms
// of OpenTelemetry's semantic conventions for messaging and RabbitMQ
// (semconv v1.43.0, the version the code imports): a publish (the
// relay's send span) or a process (the inbox's).
type MessagingSpan struct {
	// Operation is OperationPublish or OperationProcess.
	Operation string
	// Exchange and RoutingKey are the message's; Queue is the queue a
	// processed message came from ("" when not known).
	Exchange, RoutingKey, Queue string
	// MessageID is the message_id property.
	MessageID string
	// BodySize is the body's length in bytes.
	BodySize int
	// Server is the broker's address, host:port ("" when not known).
	Server string
}

// DestinationName is messaging.destination.name as the RabbitMQ
// conventions define it: for a publish {exchange}:{routing key}, or the
// one that is not empty, or amq.default when neither is; for a process
// {exchange}:{routing key}:{queue} without the empty ones, and the
// routing key alone when the queue is named the same.
func (s MessagingSpan) DestinationName() string {
	if s.Operation == OperationPublish {
		switch {
		case s.Exchange != "" && s.RoutingKey != "":
			return s.Exchange + ":" + s.RoutingKey
		case s.Exchange != "":
			return s.Exchange
		case s.RoutingKey != "":
			return s.RoutingKey
		}
		return "amq.default"
	}
	queue := s.Queue
	if queue == s.RoutingKey {
		queue = ""
	}
	parts := make([]string, 0, 3)
	for _, p := range []string{s.Exchange, s.RoutingKey, queue} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, ":")
}

// Attributes are the span's attributes: messaging.system,
// messaging.destination.name, messaging.operation.name and .type, the
// routing key when not empty, messaging.message.id, the body's size, and
// server.address and server.port when Server is known.
func (s MessagingSpan) Attributes() []attribute.KeyValue {
	opType := semconv.MessagingOperationTypeProcess
	if s.Operation == OperationPublish {
		opType = semconv.MessagingOperationTypeSend
	}
	attrs := make([]attribute.KeyValue, 0, 9)
	attrs = append(attrs,
		semconv.MessagingSystemRabbitMQ,
		semconv.MessagingDestinationName(s.DestinationName()),
		semconv.MessagingOperationName(s.Operation),
		opType,
	)
	if s.RoutingKey != "" {
		attrs = append(attrs, semconv.MessagingRabbitMQDestinationRoutingKey(s.RoutingKey))
	}
	attrs = append(attrs, semconv.MessagingMessageID(s.MessageID), semconv.MessagingMessageBodySize(s.BodySize))
	if host, port, ok := splitServer(s.Server); ok {
		attrs = append(attrs, semconv.ServerAddress(host), semconv.ServerPort(port))
	}
	return attrs
}

// splitServer splits host:port.
func splitServer(server string) (host string, port int, ok bool) {
	h, p, err := net.SplitHostPort(server)
	if err != nil || h == "" {
		return "", 0, false
	}
	n, err := strconv.Atoi(p)
	return h, n, err == nil
}

// BrokerServer returns the host:port of an AMQP URL (amqp://, amqps://),
// with the scheme's default port when it names none, or "" when it is not
// one. Credentials are not part of it.
func BrokerServer(amqpURL string) string {
	u, err := url.Parse(amqpURL)
	if err != nil || u.Hostname() == "" {
		return ""
	}
	port := u.Port()
	switch {
	case port != "":
	case u.Scheme == "amqps":
		port = "5671"
	default:
		port = "5672"
	}
	return net.JoinHostPort(u.Hostname(), port)
}
