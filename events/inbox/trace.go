package inbox

import (
	"context"
	"errors"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/outbox/events"
)

// TracerName is the instrumentation scope of the inbox's spans.
const TracerName = "github.com/outboxrelay/outbox/events/inbox"

// AttrOutcome is the consumer span's attribute that says how the delivery
// was settled: "ack", "requeue" or "reject".
const AttrOutcome = attribute.Key("outbox.inbox.outcome")

// Values of Config.TraceParent.
const (
	// TraceParentAmbient makes the process span the child of the span
	// the caller's context carries (a new root when none), linked to the
	// message's creation context: the messaging conventions' default.
	TraceParentAmbient = "ambient"
	// TraceParentMessage makes the process span the child of the
	// message's creation context, linked to it and to the caller's span:
	// the conventions' opt-in, for one trace from producer to consumer.
	TraceParentMessage = "message"
)

// process processes one delivery (processMessage) in a CONSUMER span
// named "process <exchange>" ("process" for the default exchange), with
// OpenTelemetry's messaging attributes for RabbitMQ, linked to the trace
// context its headers carry as Config.Propagator reads them (the
// message's creation context). Its parent is the span ctx carries, or,
// with TraceParentMessage, the message's context (then the span links to
// ctx's span too). Its status is an error when the handler or the
// database failed. The handler's context carries the span, and the
// message's baggage. A span that does not record (no tracer provider
// set, or not sampled) is left out: the handler's context then carries
// the message's trace context as a remote parent, unless ctx carries a
// span of its own, which it keeps.
func (i *Inbox) process(ctx context.Context, d amqp.Delivery) (outcome, error) {
	msgCtx := i.cfg.Propagator.Extract(context.Background(), headerCarrier(d.Headers))
	if b := baggage.FromContext(msgCtx); b.Len() > 0 {
		ctx = baggage.ContextWithBaggage(ctx, b)
	}
	message, ambient := trace.SpanContextFromContext(msgCtx), trace.SpanContextFromContext(ctx)
	name := "process"
	if d.Exchange != "" {
		name += " " + d.Exchange
	}
	attrs := events.MessagingSpan{Operation: events.OperationProcess, Exchange: d.Exchange, RoutingKey: d.RoutingKey,
		Queue: i.cfg.Queue, MessageID: d.MessageId, BodySize: len(d.Body), Server: i.cfg.Server}.Attributes()
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attrs...),
		trace.WithAttributes(semconv.MessagingRabbitMQMessageDeliveryTag(int(d.DeliveryTag))),
	}
	parent := ctx
	if message.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: message}))
		if i.cfg.TraceParent == TraceParentMessage {
			parent = trace.ContextWithRemoteSpanContext(ctx, message)
			if ambient.IsValid() {
				opts = append(opts, trace.WithLinks(trace.Link{SpanContext: ambient}))
			}
		}
	}
	spanCtx, span := i.tracer.Start(parent, name, opts...)
	if !span.IsRecording() {
		span.End()
		if message.IsValid() && !ambient.IsValid() {
			ctx = trace.ContextWithRemoteSpanContext(ctx, message)
		}
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
