package events

import (
	"context"
	"regexp"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// The W3C trace context an event carries from its producer
// (https://www.w3.org/TR/trace-context/): top-level string fields of the
// event document, so that producers in any language write the same, and
// the message headers of the same names, so that consumers continue the
// producer's trace.
const (
	FieldTraceParent = "traceparent"
	FieldTraceState  = "tracestate"
)

// TraceContext is a W3C trace context: the traceparent and tracestate
// values. The zero value is none.
type TraceContext struct {
	Parent string
	State  string
}

// traceParentFormat is version 00 of traceparent: version, trace id, span
// id and flags, in lower-case hex. Later versions may add fields after a
// dash; a reader that knows 00 takes its first four.
var traceParentFormat = regexp.MustCompile(`^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$`)

// maxTraceStateBytes bounds tracestate: 32 list members of at most 256
// characters, as the W3C recommendation has it, plus their commas.
const maxTraceStateBytes = 32*257 - 1

// Valid reports whether tc's traceparent is well formed (and not the
// reserved version ff, nor an all-zero trace or span id) and its
// tracestate, if any, fits the recommendation's bounds. A context that is
// not valid is dropped whole: a consumer must never continue a trace it
// cannot parse.
func (tc TraceContext) Valid() bool {
	m := traceParentFormat.FindStringSubmatch(tc.Parent)
	if m == nil || m[1] == "ff" || (m[1] == "00" && m[5] != "") {
		return false
	}
	if m[2] == "00000000000000000000000000000000" || m[3] == "0000000000000000" {
		return false
	}
	return len(tc.State) <= maxTraceStateBytes && printableASCII(tc.State)
}

// printableASCII reports whether s holds only printable ASCII, as
// tracestate's keys and values do.
func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// TraceContextFrom returns the trace context of the span in ctx (an
// OpenTelemetry span, or a remote span context a propagator extracted),
// or none when ctx carries no valid one.
func TraceContextFrom(ctx context.Context) TraceContext {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return TraceContext{}
	}
	return TraceContext{
		Parent: "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String(),
		State:  sc.TraceState().String(),
	}
}

// MessagingAttributes are the OpenTelemetry messaging attributes of a
// message on RabbitMQ (the semantic conventions' names), shared by the
// relay's publish span and the inbox's process span: the system, the
// exchange, the routing key, the message id, the operation (its name,
// which for the two is also its type: send for publish, process) and the
// body's size.
func MessagingAttributes(operation, exchange, routingKey, messageID string, bodySize int) []attribute.KeyValue {
	opType := semconv.MessagingOperationTypeProcess
	if operation == "publish" {
		opType = semconv.MessagingOperationTypeSend
	}
	return []attribute.KeyValue{
		semconv.MessagingSystemRabbitMQ,
		semconv.MessagingDestinationName(exchange),
		semconv.MessagingRabbitMQDestinationRoutingKey(routingKey),
		semconv.MessagingMessageID(messageID),
		opType,
		semconv.MessagingOperationName(operation),
		semconv.MessagingMessageBodySize(bodySize),
	}
}
