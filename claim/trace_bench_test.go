package claim

import (
	"context"
	"fmt"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/service"
)

// nullPublisher confirms every message at once.
type nullPublisher struct{ errs []error }

func (nullPublisher) Ready() error     { return nil }
func (nullPublisher) Exchange() string { return "events" }

func (p nullPublisher) Publish(_ context.Context, msgs []events.Message) []error {
	return p.errs[:len(msgs)]
}

// The relay's cost of tracing per batch of 500 messages whose events carry
// a producer's context, beside the publish itself (here a publisher that
// confirms at once): off (the default no-op provider), on with a sampler
// that records nothing, and on recording every span (with no exporter, so
// that only the spans are measured).
func BenchmarkPublishMessages(b *testing.B) {
	msgs := make([]events.Message, 500)
	for i := range msgs {
		msgs[i] = message(b, fmt.Sprint(i), events.TraceContext{Parent: producerTraceParent})
	}
	for _, tt := range []struct {
		name    string
		sampler sdktrace.Sampler // nil: tracing off
	}{
		{"off", nil},
		{"unsampled", sdktrace.NeverSample()},
		{"sampled", sdktrace.AlwaysSample()},
	} {
		b.Run(tt.name, func(b *testing.B) {
			cfg := Config{WorkerID: "bench"}
			if tt.sampler != nil {
				tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(tt.sampler))
				b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
				cfg.Archetype = service.Archetype{Tracer: tp}
			}
			c, _ := newClaimer(b, nil, nullPublisher{errs: make([]error, len(msgs))}, cfg)
			batch := make([]events.Message, len(msgs))
			b.ReportAllocs()
			for b.Loop() {
				copy(batch, msgs)
				c.publishMessages(b.Context(), batch)
			}
		})
	}
}
