package inbox

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
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

// spanSeen is a handler that notes the span context its ctx carries, and
// fails its first run.
type spanSeen struct {
	mu   sync.Mutex
	seen []trace.SpanContext
}

func (h *spanSeen) handle(ctx context.Context, _ amqp.Delivery) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seen = append(h.seen, trace.SpanContextFromContext(ctx))
	if len(h.seen) == 1 {
		return errors.New("boom")
	}
	return nil
}

func (h *spanSeen) runs() []trace.SpanContext {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.seen)
}

const (
	relayTraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	relayTraceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	relaySpanID      = "00f067aa0ba902b7"
)

// TestConsumerSpanPerRun: Run processes each delivery in a CONSUMER span,
// the child of its traceparent, which the handler's context carries; a
// failed run's span has an error status.
func TestConsumerSpanPerRun(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	h := &spanSeen{}
	r := setup(t, h.handle, Config{TracerProvider: tp})
	r.publishWith("traced", amqp.Table{"traceparent": relayTraceParent})
	r.run()
	r.eventually("two runs and two spans", func() bool { return len(h.runs()) == 2 && len(rec.Ended()) == 2 })

	spans := rec.Ended()
	for i, s := range spans {
		if s.Name() != "process" || s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("span %d: %q of kind %v, want process, consumer", i, s.Name(), s.SpanKind())
		}
		if s.Parent().TraceID().String() != relayTraceID || s.Parent().SpanID().String() != relaySpanID || !s.Parent().IsRemote() {
			t.Errorf("span %d: parent %v, want the delivery's remote %s", i, s.Parent(), relaySpanID)
		}
		if got := h.runs()[i]; got.SpanID() != s.SpanContext().SpanID() || got.TraceID() != s.SpanContext().TraceID() {
			t.Errorf("run %d: handler's span %v, want the consumer span %v", i, got.SpanID(), s.SpanContext().SpanID())
		}
		for _, want := range []attribute.KeyValue{
			semconv.MessagingSystemRabbitMQ, semconv.MessagingOperationTypeProcess,
			semconv.MessagingMessageID("traced"), semconv.MessagingRabbitMQDestinationRoutingKey(r.queue),
		} {
			if !slices.Contains(s.Attributes(), want) {
				t.Errorf("span %d: attributes %v lack %v", i, s.Attributes(), want)
			}
		}
	}
	if s := spans[0].Status(); s.Code != codes.Error || s.Description != "boom" {
		t.Errorf("failed run's status %+v, want error boom", s)
	}
	if !slices.Contains(spans[0].Attributes(), AttrOutcome.String("requeue")) || !slices.Contains(spans[1].Attributes(), AttrOutcome.String("ack")) {
		t.Errorf("outcomes %v, %v; want requeue then ack", spans[0].Attributes(), spans[1].Attributes())
	}
	if s := spans[1].Status(); s.Code == codes.Error {
		t.Errorf("successful run's status %+v", s)
	}
}

// TestRunWithoutTracingContinuesTheDeliverysContext: without a recording
// provider, the handler's context carries the delivery's trace context
// itself, under Run as under Handle.
func TestRunWithoutTracingContinuesTheDeliverysContext(t *testing.T) {
	t.Parallel()
	h := &spanSeen{}
	r := setup(t, h.handle, Config{TracerProvider: noop.NewTracerProvider()})
	r.publishWith("untraced", amqp.Table{"traceparent": relayTraceParent})
	r.run()
	r.eventually("two runs", func() bool { return len(h.runs()) == 2 })
	for i, sc := range h.runs() {
		if sc.TraceID().String() != relayTraceID || sc.SpanID().String() != relaySpanID || !sc.IsRemote() {
			t.Errorf("run %d: handler's span context %v, want the delivery's remote one", i, sc)
		}
	}
}
