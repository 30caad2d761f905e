package inbox

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/propagation"
)

// withProducerTrace returns ctx carrying the trace context of a delivery's
// traceparent and tracestate headers (the producer's, which the relay
// carries on), as an OpenTelemetry remote span context: a span the
// handler starts from ctx continues the producer's trace. A delivery
// without them, or with ones that do not parse, leaves ctx as it is.
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
