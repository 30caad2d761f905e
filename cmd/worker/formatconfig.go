package main

// The settings of the messages' format (CloudEvents) and of tracing: what a
// message looks like on the wire and what the relay's spans carry, apart
// from where the relay reads and writes.

import (
	"github.com/outboxrelay/outbox/claim"
	"github.com/outboxrelay/outbox/events"
)

// formatSettings are the settings of the messages' format.
func formatSettings() []setting {
	return []setting{
		{env: "OUTBOX_MESSAGE_FORMAT", flag: "message-format", def: events.FormatPlain,
			usage: "plain: the message contract; cloudevents-binary: plus the CloudEvents attributes as headers (OUTBOX_CLOUDEVENTS_PREFIX); cloudevents-structured: the application/cloudevents+json envelope as the body",
			parse: func(c *Config, v string) error {
				return oneOf(&c.MessageFormat, v, events.FormatPlain, events.FormatCloudEventsBinary, events.FormatCloudEventsStructured)
			}},
		{env: "OUTBOX_CLOUDEVENTS_SOURCE", flag: "cloudevents-source", def: "",
			usage: "CloudEvents source attribute of every message in a CloudEvents format, a URI-reference; unset: /outbox/<database>/<collection>",
			parse: parseCloudEventsSource},
		{env: "OUTBOX_CLOUDEVENTS_PREFIX", flag: "cloudevents-prefix", def: events.PrefixAMQP,
			usage: "prefix of the attribute headers in cloudevents-binary: cloudEvents_ (AMQP binding; the Java SDK's Spring AMQP), cloudEvents: (AMQP binding 1.0.2; sdk-go) or ce- (Knative's RabbitMQ broker and source)",
			parse: func(c *Config, v string) error {
				return oneOf(&c.CloudEventsPrefix, v, events.PrefixAMQP, events.PrefixAMQPColon, events.PrefixKnative)
			}},
	}
}

// traceSettings are the settings of tracing, which OTEL_TRACES_EXPORTER
// turns on (internal/telemetry).
func traceSettings() []setting {
	return []setting{
		{env: "OUTBOX_TRACE_PARENT", flag: "trace-parent", def: claim.TraceParentLink,
			usage: "with tracing on (OTEL_TRACES_EXPORTER=otlp): link makes each publish span link to the producer's span stored with the event, in a trace of the relay's; child makes it that span's child too",
			parse: func(c *Config, v string) error {
				return oneOf(&c.TraceParent, v, claim.TraceParentLink, claim.TraceParentChild)
			}},
		{env: "OUTBOX_TRACE_MESSAGE", flag: "trace-message", def: claim.TraceMessageProducer,
			usage: "with tracing on: producer keeps the producer's stored trace context on each message; publish puts the publish span's in its place",
			parse: func(c *Config, v string) error {
				return oneOf(&c.TraceMessage, v, claim.TraceMessageProducer, claim.TraceMessagePublish)
			}},
		{env: "OUTBOX_TRACE_MONGO", flag: "trace-mongo", def: "false",
			usage: "with tracing on, also trace every database command (a client span each, without the command's documents)",
			parse: func(c *Config, v string) error { return parseBool(&c.TraceMongo, v) }},
	}
}

func parseCloudEventsSource(c *Config, v string) error {
	if v == "" {
		c.CloudEventsSource = "" // derived by validate
		return nil
	}
	if err := events.CheckCloudEventsSource(v); err != nil {
		return err
	}
	c.CloudEventsSource = v
	return nil
}
