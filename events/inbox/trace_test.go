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
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

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

// w3c is the propagator the tests configure: the relay writes W3C.
var w3c = propagation.TraceContext{}

// spanRecorder returns a tracer provider whose spans rec records.
func spanRecorder(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, rec
}

// isRelays reports whether sc is the relay's span of relayTraceParent.
func isRelays(sc trace.SpanContext) bool {
	return sc.TraceID().String() == relayTraceID && sc.SpanID().String() == relaySpanID
}

// TestConsumerSpanPerRun: Run processes each delivery in a CONSUMER span
// linked to the message's creation context (its traceparent), not its
// child: Run's context has no span, so the span starts a trace. The
// handler's context carries the span; a failed run's span has an error
// status.
func TestConsumerSpanPerRun(t *testing.T) {
	t.Parallel()
	tp, rec := spanRecorder(t)
	h := &spanSeen{}
	r := setup(t, h.handle, Config{TracerProvider: tp, Propagator: w3c, Queue: "orders-in", Server: "rabbit.internal:5672"})
	r.publishWith("traced", amqp.Table{"traceparent": relayTraceParent})
	r.run()
	r.eventually("two runs and two spans", func() bool { return len(h.runs()) == 2 && len(rec.Ended()) == 2 })

	spans := rec.Ended()
	for i, s := range spans {
		if s.Name() != "process" || s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("span %d: %q of kind %v, want process, consumer", i, s.Name(), s.SpanKind())
		}
		if s.Parent().IsValid() {
			t.Errorf("span %d: parent %v, want none (Run's context has no span)", i, s.Parent())
		}
		if l := s.Links(); len(l) != 1 || !isRelays(l[0].SpanContext) {
			t.Errorf("span %d: links %+v, want one to the delivery's %s", i, l, relaySpanID)
		}
		if got := h.runs()[i]; got.SpanID() != s.SpanContext().SpanID() || got.TraceID() != s.SpanContext().TraceID() {
			t.Errorf("run %d: handler's span %v, want the consumer span %v", i, got.SpanID(), s.SpanContext().SpanID())
		}
		for _, want := range []attribute.KeyValue{
			semconv.MessagingSystemRabbitMQ, semconv.MessagingOperationTypeProcess,
			semconv.MessagingMessageID("traced"), semconv.MessagingRabbitMQDestinationRoutingKey(r.queue),
			semconv.MessagingDestinationName(r.queue + ":orders-in"), // the default exchange has no name
			semconv.ServerAddress("rabbit.internal"), semconv.ServerPort(5672),
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

// ambientContext is a context carrying a sampled span of the caller's.
func ambientContext(t *testing.T) (context.Context, trace.SpanContext) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0xaa, 1}, SpanID: trace.SpanID{0xbb, 2}, TraceFlags: trace.FlagsSampled,
	})
	return trace.ContextWithSpanContext(t.Context(), sc), sc
}

// TestProcessSpanParents: under Handle with a caller's span, the process
// span is that span's child, linked to the message's creation context; with
// TraceParentMessage it is the message context's child, linked to both.
func TestProcessSpanParents(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"", TraceParentMessage} {
		t.Run("mode "+mode, func(t *testing.T) {
			t.Parallel()
			tp, rec := spanRecorder(t)
			h := &spanSeen{}
			r := setup(t, h.handle, Config{TracerProvider: tp, Propagator: w3c, TraceParent: mode})
			r.publishWith("m", amqp.Table{"traceparent": relayTraceParent})
			ctx, ambient := ambientContext(t)
			ch := r.channel()
			if err := r.in.Handle(ctx, r.receive(ch)); err != nil {
				t.Fatal(err)
			}
			s := rec.Ended()[0]
			var links []trace.SpanContext
			for _, l := range s.Links() {
				links = append(links, l.SpanContext)
			}
			if mode == TraceParentMessage {
				if !isRelays(s.Parent()) || len(links) != 2 || !isRelays(links[0]) || !links[1].Equal(ambient) {
					t.Errorf("parent %v, links %v; want the message's, linked to it and to the caller's", s.Parent(), links)
				}
				return
			}
			if s.Parent().SpanID() != ambient.SpanID() || len(links) != 1 || !isRelays(links[0]) {
				t.Errorf("parent %v, links %v; want the caller's span, linked to the message's", s.Parent(), links)
			}
		})
	}
}

// TestProcessUsesTheConfiguredPropagator: the inbox reads a delivery's
// context with Config.Propagator: one that reads nothing leaves the span
// without a link, and the handler without the message's context.
func TestProcessUsesTheConfiguredPropagator(t *testing.T) {
	t.Parallel()
	tp, rec := spanRecorder(t)
	h := &spanSeen{}
	r := setup(t, h.handle, Config{TracerProvider: tp, Propagator: propagation.NewCompositeTextMapPropagator()})
	r.publishWith("m", amqp.Table{"traceparent": relayTraceParent})
	ch := r.channel()
	if err := r.in.Handle(t.Context(), r.receive(ch)); err != nil {
		t.Fatal(err)
	}
	if s := rec.Ended()[0]; len(s.Links()) != 0 || s.Parent().IsValid() || isRelays(h.runs()[0]) {
		t.Errorf("links %v, parent %v, handler's context %v: want none of the message's", s.Links(), s.Parent(), h.runs()[0])
	}
}

// TestRunWithoutTracingContinuesTheDeliverysContext: without a recording
// provider, the handler's context carries the delivery's trace context
// itself, under Run as under Handle, unless the caller's context carries
// a span, which it keeps.
func TestRunWithoutTracingContinuesTheDeliverysContext(t *testing.T) {
	t.Parallel()
	h := &spanSeen{}
	r := setup(t, h.handle, Config{TracerProvider: noop.NewTracerProvider(), Propagator: w3c})
	r.publishWith("untraced", amqp.Table{"traceparent": relayTraceParent})
	r.run()
	r.eventually("two runs", func() bool { return len(h.runs()) == 2 })
	for i, sc := range h.runs() {
		if !isRelays(sc) || !sc.IsRemote() {
			t.Errorf("run %d: handler's span context %v, want the delivery's remote one", i, sc)
		}
	}

	h2 := &spanSeen{}
	r2 := setup(t, h2.handle, Config{TracerProvider: noop.NewTracerProvider(), Propagator: w3c})
	r2.publishWith("ambient", amqp.Table{"traceparent": relayTraceParent})
	ctx, ambient := ambientContext(t)
	ch := r2.channel()
	_ = r2.in.Handle(ctx, r2.receive(ch))
	if got := h2.runs()[0]; !got.Equal(ambient) {
		t.Errorf("handler's span context %v, want the caller's %v", got, ambient)
	}
}
