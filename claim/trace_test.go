package claim

import (
	"context"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/metrics/metricstest"
)

// TestTraceContextTravels: an event inserted inside a producer's span is
// published with that span's traceparent and tracestate; an event whose
// stored context is malformed is published all the same, without it, and
// counted.
func TestTraceContextTravels(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ts, err := trace.ParseTraceState("vendor=abc")
	if err != nil {
		t.Fatal(err)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		SpanID:  trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8}, TraceFlags: trace.FlagsSampled, TraceState: ts,
	})
	producerCtx := trace.ContextWithSpanContext(t.Context(), sc)
	if _, err := events.Insert(producerCtx, b.coll, events.Draft{ID: "traced", Type: "t", Payload: bson.D{{Key: "n", Value: 1}}}); err != nil {
		t.Fatal(err)
	}
	bad, err := events.Draft{ID: "bad-trace", Type: "t", Payload: bson.D{{Key: "n", Value: 2}}}.Document(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.coll.InsertOne(t.Context(), append(bad, bson.E{Key: events.FieldTraceParent, Value: "00-not-a-trace"})); err != nil {
		t.Fatal(err)
	}
	c, m := newClaimer(t, b.store, newPublisher(t, b.exchange), Config{BatchSize: 10})
	runOnce(t, c)
	got := map[string]map[string]any{}
	ctx, cancel := context.WithTimeout(t.Context(), waitFor)
	defer cancel()
	for len(got) < 2 {
		select {
		case d := <-b.deliveries:
			got[d.MessageId] = d.Headers
		case <-ctx.Done():
			t.Fatalf("received %d of 2 messages", len(got))
		}
	}
	wantParent := "00-0102030405060708090a0b0c0d0e0f10-0102030405060708-01"
	if h := got["traced"]; h["traceparent"] != wantParent || h["tracestate"] != "vendor=abc" {
		t.Errorf("the traced event's headers %v, want traceparent %s and tracestate vendor=abc", h, wantParent)
	}
	if h := got["bad-trace"]; h["traceparent"] != nil {
		t.Errorf("the malformed context went out: %v", h)
	}
	metricstest.Want(t, "outbox_trace_context_dropped_total", m.TraceDropped, 1)
}
