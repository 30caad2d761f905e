package inbox

import (
	"context"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"
)

// TestHandlerContextContinuesTheProducersTrace: a delivery's traceparent
// and tracestate become the handler's remote span context; without them,
// or with ones that do not parse, the context carries none.
func TestHandlerContextContinuesTheProducersTrace(t *testing.T) {
	t.Parallel()
	ctx := withProducerTrace(context.Background(), amqp.Table{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tracestate":  "rojo=00f067aa0ba902b7",
	})
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() || !sc.IsRemote() || sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" ||
		sc.SpanID().String() != "00f067aa0ba902b7" || !sc.IsSampled() || sc.TraceState().Get("rojo") != "00f067aa0ba902b7" {
		t.Errorf("span context = %+v", sc)
	}
	for _, headers := range []amqp.Table{nil, {"traceparent": "garbage"}, {"traceparent": int32(7)}} {
		if sc := trace.SpanContextFromContext(withProducerTrace(context.Background(), headers)); sc.IsValid() {
			t.Errorf("headers %v gave the span context %+v, want none", headers, sc)
		}
	}
}
