package claim

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
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

// capturePublisher is a Publisher that keeps what it is given and answers
// each message with errs[i] (nil past its end), without a broker.
type capturePublisher struct {
	errs []error
	got  []events.Message
}

func (*capturePublisher) Ready() error     { return nil }
func (*capturePublisher) Exchange() string { return "orders" }

func (p *capturePublisher) Publish(_ context.Context, msgs []events.Message) []error {
	p.got = append(p.got, msgs...)
	errs := make([]error, len(msgs))
	copy(errs, p.errs)
	return errs
}

// The producer's span context the unit tests store in their events.
var (
	producerSC = trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0xa1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		SpanID:  trace.SpanID{0xb1, 2, 3, 4, 5, 6, 7, 8}, TraceFlags: trace.FlagsSampled, Remote: true,
	})
	producerTraceParent = "00-a102030405060708090a0b0c0d0e0f10-b102030405060708-01"
)

// tracedClaimer returns a Claimer on pub with an SDK tracer provider
// whose spans rec records, sampling as sampler does.
func tracedClaimer(t *testing.T, pub Publisher, sampler sdktrace.Sampler, parent, message string) (*Claimer, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sampler))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	cfg := Config{WorkerID: "worker-t", TraceParent: parent, TraceMessage: message}
	cfg.Tracer = tp
	c, _ := newClaimer(t, nil, pub, cfg)
	return c, rec
}

// message returns the message of an event stored with the trace context
// tc and, when extra is set, more fields.
func message(t testing.TB, id string, tc events.TraceContext, extra ...bson.E) events.Message {
	t.Helper()
	d, err := events.Draft{ID: id, Type: "order.created", Payload: bson.D{{Key: "n", Value: 1}}, Trace: tc}.Document(time.Now().Add(-time.Second))
	if err != nil {
		t.Fatal(err)
	}
	m, err := events.NewMessage(testenv.Marshal(t, append(d, extra...)), 0)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// spanByMessage returns the ended spans by their messaging.message.id.
func spanByMessage(t *testing.T, rec *tracetest.SpanRecorder) map[string]sdktrace.ReadOnlySpan {
	t.Helper()
	out := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		for _, kv := range s.Attributes() {
			if kv.Key == semconv.MessagingMessageIDKey {
				out[kv.Value.AsString()] = s
			}
		}
	}
	return out
}

// TestPublishSpanLinksToTheStoredContext: by default a message's publish
// span links to its event's stored context (the message's creation
// context) from the caller's context, with the messaging attributes, and
// the message carries the stored context unchanged: the span is of kind
// CLIENT, as the conventions say of a send span whose context is not the
// message's.
func TestPublishSpanLinksToTheStoredContext(t *testing.T) {
	t.Parallel()
	pub := &capturePublisher{}
	c, rec := tracedClaimer(t, pub, sdktrace.AlwaysSample(), "", "")
	m := message(t, "linked", events.TraceContext{Parent: producerTraceParent, State: "vendor=x"})
	errs := c.publishMessages(t.Context(), []events.Message{m})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	span := spanByMessage(t, rec)["linked"]
	if span == nil {
		t.Fatalf("no publish span among %d", len(rec.Ended()))
	}
	if span.Name() != "publish orders" || span.SpanKind() != trace.SpanKindClient {
		t.Errorf("span %q of kind %v, want %q of kind client", span.Name(), span.SpanKind(), "publish orders")
	}
	if span.Parent().IsValid() || span.SpanContext().TraceID() == producerSC.TraceID() {
		t.Errorf("span's parent %v in trace %v, want the caller's (none)", span.Parent().SpanID(), span.SpanContext().TraceID())
	}
	if l := span.Links(); len(l) != 1 || l[0].SpanContext.SpanID() != producerSC.SpanID() || l[0].SpanContext.TraceID() != producerSC.TraceID() ||
		l[0].SpanContext.TraceState().Get("vendor") != "x" {
		t.Errorf("links %+v, want one to the stored context", l)
	}
	attrs := map[attribute.Key]attribute.Value{}
	for _, kv := range span.Attributes() {
		attrs[kv.Key] = kv.Value
	}
	for k, want := range map[attribute.Key]string{
		semconv.MessagingSystemKey: "rabbitmq", semconv.MessagingDestinationNameKey: "orders:order.created",
		semconv.MessagingRabbitMQDestinationRoutingKeyKey: "order.created", semconv.MessagingMessageIDKey: "linked",
		semconv.MessagingOperationTypeKey: "send", semconv.MessagingOperationNameKey: "publish",
	} {
		if got := attrs[k].String(); got != want {
			t.Errorf("attribute %s = %q, want %q", k, got, want)
		}
	}
	if got := attrs[semconv.MessagingMessageBodySizeKey].AsInt64(); got != int64(len(m.Body)) {
		t.Errorf("body size %d, want %d", got, len(m.Body))
	}
	if got := attrs[AttrWaitMillis].AsInt64(); got < 1000 {
		t.Errorf("waited %d ms, want at least the 1000 since its createdAt", got)
	}
	sent := pub.got[0].Headers
	if sent[events.FieldTraceParent] != producerTraceParent || sent[events.FieldTraceState] != "vendor=x" {
		t.Errorf("sent traceparent %v tracestate %v, want the stored %s and vendor=x", sent[events.FieldTraceParent], sent[events.FieldTraceState], producerTraceParent)
	}
}

// TestPublishSpanChildCarriedByTheMessage: with TraceParentChild the span
// is the stored context's child, still linked to it; with
// TraceMessagePublish the message carries the span's context in a copy of
// its headers, and the span is of kind PRODUCER.
func TestPublishSpanChildCarriedByTheMessage(t *testing.T) {
	t.Parallel()
	pub := &capturePublisher{}
	c, rec := tracedClaimer(t, pub, sdktrace.AlwaysSample(), TraceParentChild, TraceMessagePublish)
	m := message(t, "child", events.TraceContext{Parent: producerTraceParent, State: "vendor=x"})
	stored := m.Headers
	c.publishMessages(t.Context(), []events.Message{m})
	span := spanByMessage(t, rec)["child"]
	if span == nil {
		t.Fatal("no publish span")
	}
	if span.SpanKind() != trace.SpanKindProducer || span.Parent().SpanID() != producerSC.SpanID() || span.SpanContext().TraceID() != producerSC.TraceID() {
		t.Errorf("span of kind %v, parent %v in trace %v; want a producer span, the stored context's child", span.SpanKind(), span.Parent().SpanID(), span.SpanContext().TraceID())
	}
	if l := span.Links(); len(l) != 1 || l[0].SpanContext.SpanID() != producerSC.SpanID() {
		t.Errorf("links %+v, want one to the stored context", l)
	}
	sent := pub.got[0].Headers
	want := "00-" + span.SpanContext().TraceID().String() + "-" + span.SpanContext().SpanID().String() + "-01"
	if sent[events.FieldTraceParent] != want || sent[events.FieldTraceState] != "vendor=x" {
		t.Errorf("sent traceparent %v tracestate %v, want %s and vendor=x", sent[events.FieldTraceParent], sent[events.FieldTraceState], want)
	}
	if stored[events.FieldTraceParent] != producerTraceParent {
		t.Errorf("the message's own headers were changed: %v", stored)
	}
}

// TestPublishSpanOfAMalformedContextIsARoot: an event whose stored context
// is malformed (dropped by NewMessage), or whose own traceparent header
// does not parse, still gets its span, a root of kind PRODUCER, and goes
// out with it: without a creation context of the producer's, the span's
// is the message's.
func TestPublishSpanOfAMalformedContextIsARoot(t *testing.T) {
	t.Parallel()
	pub := &capturePublisher{}
	c, rec := tracedClaimer(t, pub, sdktrace.AlwaysSample(), "", "")
	dropped := message(t, "dropped", events.TraceContext{}, bson.E{Key: events.FieldTraceParent, Value: "00-garbage"})
	if !dropped.TraceDropped {
		t.Fatal("NewMessage kept a malformed traceparent")
	}
	header := message(t, "header", events.TraceContext{}, bson.E{Key: events.FieldHeaders, Value: bson.D{{Key: "traceparent", Value: "ff-nonsense"}}})
	none := message(t, "none", events.TraceContext{})
	c.publishMessages(t.Context(), []events.Message{dropped, header, none})
	spans := spanByMessage(t, rec)
	for i, id := range []string{"dropped", "header", "none"} {
		s := spans[id]
		if s == nil {
			t.Errorf("%s: no span", id)
			continue
		}
		if s.Parent().IsValid() || len(s.Links()) != 0 || s.SpanKind() != trace.SpanKindProducer {
			t.Errorf("%s: parent %v, links %v, kind %v; want a root of kind producer", id, s.Parent(), s.Links(), s.SpanKind())
		}
		want := "00-" + s.SpanContext().TraceID().String() + "-" + s.SpanContext().SpanID().String() + "-01"
		if got := pub.got[i].Headers[events.FieldTraceParent]; pub.got[i].ID != id || got != want {
			t.Errorf("%s: sent %s with traceparent %v, want %s", id, pub.got[i].ID, got, want)
		}
	}
}

// TestPublishSpanNotRecordingLeavesTheStoredContext: a span the sampler
// drops leaves the message's stored context as it was; a no-op provider
// starts nothing and passes the batch through.
func TestPublishSpanNotRecordingLeavesTheStoredContext(t *testing.T) {
	t.Parallel()
	pub := &capturePublisher{}
	c, rec := tracedClaimer(t, pub, sdktrace.NeverSample(), "", "")
	c.publishMessages(t.Context(), []events.Message{message(t, "unsampled", events.TraceContext{Parent: producerTraceParent})})
	if n := len(rec.Ended()); n != 0 {
		t.Errorf("%d spans recorded, want none", n)
	}
	if got := pub.got[0].Headers[events.FieldTraceParent]; got != producerTraceParent {
		t.Errorf("sent traceparent %v, want the stored %s", got, producerTraceParent)
	}

	off := &capturePublisher{}
	c, _ = newClaimer(t, nil, off, Config{})
	if c.trace.on {
		t.Fatal("tracing is on with the default no-op provider")
	}
	m := message(t, "off", events.TraceContext{Parent: producerTraceParent})
	c.publishMessages(t.Context(), []events.Message{m})
	if got := off.got[0].Headers; got[events.FieldTraceParent] != producerTraceParent || reflect.ValueOf(got).Pointer() != reflect.ValueOf(m.Headers).Pointer() {
		t.Errorf("tracing off sent headers %v, want the message's own map", got)
	}
}

// TestPublishSpanFailure: a failed publish ends its span with an error
// status and error.type.
func TestPublishSpanFailure(t *testing.T) {
	t.Parallel()
	returned := fmt.Errorf("%w: 312 NO_ROUTE", events.ErrReturned)
	c, rec := tracedClaimer(t, &capturePublisher{errs: []error{returned, nil}}, sdktrace.AlwaysSample(), "", "")
	c.publishMessages(t.Context(), []events.Message{message(t, "bad", events.TraceContext{}), message(t, "good", events.TraceContext{})})
	spans := spanByMessage(t, rec)
	if s := spans["bad"]; s == nil || s.Status().Code != codes.Error || s.Status().Description != returned.Error() {
		t.Errorf("failed publish's span status %+v, want an error: %v", s.Status(), returned)
	} else if !slices.Contains(s.Attributes(), semconv.ErrorTypeKey.String("returned")) {
		t.Errorf("failed publish's attributes %v lack error.type returned", s.Attributes())
	}
	if s := spans["good"]; s == nil || s.Status().Code == codes.Error {
		t.Errorf("confirmed publish's span %v has an error status", s)
	}
}

// TestBatchLinksAreBounded: a batch span links to at most MaxBatchLinks
// stored contexts, skipping events without one, and counts the rest.
func TestBatchLinksAreBounded(t *testing.T) {
	t.Parallel()
	var docs []bson.Raw
	for i := range MaxBatchLinks + 5 {
		tc := events.TraceContext{Parent: fmt.Sprintf("00-a102030405060708090a0b0c0d0e0f10-%016x-01", i+1)}
		d, err := events.Draft{ID: fmt.Sprint(i), Type: "t", Payload: bson.D{}, Trace: tc}.Document(time.Now())
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, testenv.Marshal(t, d), testenv.Marshal(t, bson.D{{Key: "_id", Value: "untraced"}}))
	}
	links, dropped := batchLinks(docs)
	if len(links) != MaxBatchLinks || dropped != 5 {
		t.Fatalf("%d links, %d dropped; want %d and 5", len(links), dropped, MaxBatchLinks)
	}
	if got := links[MaxBatchLinks-1].SpanContext.SpanID().String(); got != fmt.Sprintf("%016x", MaxBatchLinks) {
		t.Errorf("last link to span %s, want the %dth event's", got, MaxBatchLinks)
	}
}
