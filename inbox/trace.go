package inbox

import (
	"context"
	"errors"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// TracerName is the instrumentation scope of the inbox's spans.
const TracerName = "github.com/outboxrelay/outbox/inbox"

// AttrOutcome is the consumer span's attribute that says how the delivery
// was settled: "ack", "requeue" or "reject".
const AttrOutcome = attribute.Key("outbox.inbox.outcome")

// process processes one delivery (processMessage) in a CONSUMER span, the
// child of the trace context its headers carry (withProducerTrace): named
// "process <exchange>" ("process" for the default exchange), with
// OpenTelemetry's messaging attributes for RabbitMQ; its status is an
// error when the handler or the database failed. The handler's context
// carries the span. A span that does not record (no tracer provider set,
// or not sampled) is left out, and the handler's context carries the
// delivery's trace context as it came.
func (i *Inbox) process(ctx context.Context, d amqp.Delivery) (outcome, error) {
	ctx = withProducerTrace(ctx, d.Headers)
	name := "process"
	if d.Exchange != "" {
		name += " " + d.Exchange
	}
	spanCtx, span := i.tracer.Start(ctx, name,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			semconv.MessagingSystemRabbitMQ,
			semconv.MessagingDestinationName(d.Exchange),
			semconv.MessagingRabbitMQDestinationRoutingKey(d.RoutingKey),
			semconv.MessagingMessageID(d.MessageId),
			semconv.MessagingOperationTypeProcess,
			semconv.MessagingOperationName("process"),
			semconv.MessagingMessageBodySize(len(d.Body)),
			semconv.MessagingRabbitMQMessageDeliveryTag(int(d.DeliveryTag)),
		))
	if !span.IsRecording() {
		span.End()
		out, _, err := i.processMessage(ctx, d)
		return out, err
	}
	defer span.End()
	out, handlerErr, err := i.processMessage(spanCtx, d)
	span.SetAttributes(AttrOutcome.String(outcomeNames[out]))
	if cause := errors.Join(handlerErr, err); cause != nil {
		span.SetStatus(codes.Error, cause.Error())
		errType := "handler"
		if handlerErr == nil {
			errType = semconv.ErrorTypeOther.Value.AsString() // the database, or a stop
		}
		span.SetAttributes(semconv.ErrorTypeKey.String(errType))
	}
	return out, err
}

var outcomeNames = map[outcome]string{outcomeAck: "ack", outcomeRequeue: "requeue", outcomeReject: "reject"}

// withProducerTrace returns ctx carrying the trace context of a delivery's
// traceparent and tracestate headers (the relay's publish span, or the
// producer's span where the relay records none), as an OpenTelemetry
// remote span context: a span started from ctx continues that trace. A
// delivery without them, or with ones that do not parse, leaves ctx as it
// is.
func withProducerTrace(ctx context.Context, headers amqp.Table) context.Context {
	return propagation.TraceContext{}.Extract(ctx, headerCarrier(headers))
}

// headerCarrier reads AMQP headers as a propagation.TextMapCarrier.
type headerCarrier amqp.Table

func (h headerCarrier) Get(key string) string {
	s, _ := h[key].(string)
	return s
}

// Set does nothing: the inbox only reads a delivery's headers.
func (h headerCarrier) Set(string, string) {}

func (h headerCarrier) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}
