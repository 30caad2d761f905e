package claim

import (
	"context"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/outbox/events"
	inboxpkg "github.com/outboxrelay/outbox/events/inbox"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/mongo/mongotest"
	"github.com/outboxrelay/outbox/service"
)

// recordingProvider returns an SDK tracer provider that samples every
// span, and the recorder of its ended spans.
func recordingProvider(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, rec
}

// produce inserts an order event inside a producer's span, as a request
// handler would, and returns the event's message id and the span.
func produce(t *testing.T, tp trace.TracerProvider, coll *mongo.Store) (string, trace.SpanContext) {
	t.Helper()
	ctx, span := tp.Tracer("test/producer").Start(t.Context(), "place order")
	defer span.End()
	id, err := events.Insert(ctx, coll.Collection(), events.Draft{
		Type: "order.created", AggregateType: "order", AggregateID: "o-1", Payload: bson.D{{Key: "total", Value: 42}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return testenv.MessageID(id), span.SpanContext()
}

// named returns the ended spans named name, in the order they ended.
func named(rec *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// wantAttributes checks that span has every attribute of want.
func wantAttributes(t *testing.T, what string, span sdktrace.ReadOnlySpan, want ...attribute.KeyValue) {
	t.Helper()
	for _, kv := range want {
		if !slices.Contains(span.Attributes(), kv) {
			t.Errorf("%s: attributes %v lack %s=%s", what, span.Attributes(), kv.Key, kv.Value.String())
		}
	}
}

// wantLinkTo checks that span links to sc.
func wantLinkTo(t *testing.T, what string, span sdktrace.ReadOnlySpan, sc trace.SpanContext) {
	t.Helper()
	if !slices.ContainsFunc(span.Links(), func(l sdktrace.Link) bool {
		return l.SpanContext.TraceID() == sc.TraceID() && l.SpanContext.SpanID() == sc.SpanID()
	}) {
		t.Errorf("%s: links %v, want one to %v", what, span.Links(), sc.SpanID())
	}
}

// traceParent is the traceparent header of a sampled span context.
func traceParent(sc trace.SpanContext) string {
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
}

// TestTraceEndToEnd follows one event from its producer's span through the
// relay to the inbox on FerretDB and RabbitMQ, with an in-memory span
// recorder. Its first publish is returned (no queue is bound yet) and,
// with one attempt allowed, fails the event; an operator requeues it; the
// second relay delivers it and the inbox processes it. Every span is in
// the producer's trace: both publish spans are the producer span's
// children, the consumer span the child of the publish that delivered.
func TestTraceEndToEnd(t *testing.T) {
	t.Parallel()
	tp, rec := recordingProvider(t)
	store := mongotest.Store(t)
	url := testenv.AMQPURL(t)
	exchange, queue := testenv.UniqueName(t, "ex_"), testenv.UniqueName(t, "q_")
	conn := testenv.Dial(t, url)
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
		}
	})
	pub := newPublisher(t, exchange)
	tracing := service.Archetype{Tracer: tp}

	id, producer := produce(t, tp, store)

	first, _ := newClaimer(t, store, pub, Config{WorkerID: "worker-a", MaxAttempts: 1, Archetype: tracing})
	runOnce(t, first)
	if got := allEvents(t, store.Collection())[id].Status; got != events.StatusFailed {
		t.Fatalf("after an unroutable publish with one attempt the event is %s, want FAILED", got)
	}
	if n, err := store.Requeue(t.Context(), mongo.RequeueFilter{IDs: []string{id}}, false); err != nil || n != 1 {
		t.Fatalf("Requeue = %d, %v; want 1", n, err)
	}

	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, "#", exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	second, _ := newClaimer(t, store, pub, Config{WorkerID: "worker-b", Archetype: tracing})
	runOnce(t, second)
	var d amqp.Delivery
	select {
	case d = <-deliveries:
	case <-time.After(waitFor):
		t.Fatal("the requeued event was not delivered")
	}

	var mu sync.Mutex
	var handled trace.SpanContext
	db := testenv.Database(t)
	in, err := inboxpkg.New(db.Client(), func(ctx context.Context, _ amqp.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		handled = trace.SpanContextFromContext(ctx)
		return nil
	}, inboxpkg.Config{Database: db.Name(), Logger: discard, TracerProvider: tp, Propagator: propagation.TraceContext{}, Queue: queue})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, in)
	if err := in.Handle(t.Context(), d); err != nil {
		t.Fatalf("Handle: %v", err)
	}

	publishes := named(rec, "publish "+exchange)
	if len(publishes) != 2 {
		t.Fatalf("%d publish spans, want 2 (returned, then delivered)", len(publishes))
	}
	host, port, err := net.SplitHostPort(events.BrokerServer(url))
	if err != nil {
		t.Fatal(err)
	}
	portNumber, _ := strconv.Atoi(port)
	for i, p := range publishes {
		if p.SpanKind() != trace.SpanKindClient || p.SpanContext().TraceID() == producer.TraceID() || p.Parent().IsValid() {
			t.Errorf("publish %d: kind %v, trace %v, parent %v; want a client span starting a trace of its own",
				i, p.SpanKind(), p.SpanContext().TraceID(), p.Parent().SpanID())
		}
		wantLinkTo(t, "publish", p, producer)
		wantAttributes(t, "publish", p, semconv.MessagingSystemRabbitMQ, semconv.MessagingDestinationName(exchange+":order.created"),
			semconv.MessagingRabbitMQDestinationRoutingKey("order.created"), semconv.MessagingMessageID(id),
			semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("publish"),
			semconv.ServerAddress(host), semconv.ServerPort(portNumber))
		if !slices.ContainsFunc(p.Attributes(), func(kv attribute.KeyValue) bool { return kv.Key == AttrWaitMillis && kv.Value.AsInt64() >= 0 }) {
			t.Errorf("publish %d: no %s among %v", i, AttrWaitMillis, p.Attributes())
		}
	}
	if s := publishes[0]; s.Status().Code != codes.Error || !slices.Contains(s.Attributes(), semconv.ErrorTypeKey.String("returned")) {
		t.Errorf("the returned publish's status %+v, attributes %v; want an error, error.type returned", s.Status(), s.Attributes())
	}
	if s := publishes[1]; s.Status().Code == codes.Error {
		t.Errorf("the delivered publish's status %+v", s.Status())
	}
	if got := d.Headers[events.FieldTraceParent]; got != traceParent(producer) {
		t.Errorf("the message's traceparent %v, want the producer's %s, unchanged", got, traceParent(producer))
	}

	consumers := named(rec, "process "+exchange)
	if len(consumers) != 1 {
		t.Fatalf("%d consumer spans, want 1", len(consumers))
	}
	c := consumers[0]
	if c.SpanKind() != trace.SpanKindConsumer || c.Parent().IsValid() {
		t.Errorf("consumer span: kind %v, parent %v; want a consumer span of the handler's own (no ambient span)", c.SpanKind(), c.Parent().SpanID())
	}
	wantLinkTo(t, "consumer", c, producer)
	wantAttributes(t, "consumer", c, semconv.MessagingSystemRabbitMQ, semconv.MessagingDestinationName(exchange+":order.created:"+queue),
		semconv.MessagingRabbitMQDestinationRoutingKey("order.created"), semconv.MessagingMessageID(id),
		semconv.MessagingOperationTypeProcess)
	mu.Lock()
	if handled.SpanID() != c.SpanContext().SpanID() {
		t.Errorf("the handler's span %v, want the consumer span %v", handled.SpanID(), c.SpanContext().SpanID())
	}
	mu.Unlock()

	for _, name := range []string{SpanClaim, SpanSettle} {
		batches := named(rec, name)
		if len(batches) != 2 {
			t.Errorf("%d %s spans, want one per relay", len(batches), name)
			continue
		}
		for i, s := range batches {
			if s.SpanKind() != trace.SpanKindInternal {
				t.Errorf("%s %d: kind %v, want internal", name, i, s.SpanKind())
			}
			wantLinkTo(t, name, s, producer)
			wantAttributes(t, name, s, AttrWorkerID.String([]string{"worker-a", "worker-b"}[i]), semconv.MessagingBatchMessageCount(1))
		}
	}
	if s := named(rec, SpanSettle); len(s) == 2 {
		wantAttributes(t, "first settle", s[0], AttrPublished.Int(0), AttrReleased.Int(1))
		wantAttributes(t, "second settle", s[1], AttrPublished.Int(1), AttrReleased.Int(0))
	}
}

// TestTraceChildAndPublishContext: with TraceParentChild the publish span
// is the producer span's child (and links to it); with TraceMessagePublish
// the message carries the publish span's context, and the span is then of
// kind PRODUCER.
func TestTraceChildAndPublishContext(t *testing.T) {
	t.Parallel()
	tp, rec := recordingProvider(t)
	b := setup(t)
	id, producer := produce(t, tp, b.store)
	c, _ := newClaimer(t, b.store, newPublisher(t, b.exchange), Config{TraceParent: TraceParentChild, TraceMessage: TraceMessagePublish,
		Archetype: service.Archetype{Tracer: tp}})
	runOnce(t, c)
	var d amqp.Delivery
	select {
	case d = <-b.deliveries:
	case <-time.After(waitFor):
		t.Fatal("no delivery")
	}
	publishes := named(rec, "publish "+b.exchange)
	if len(publishes) != 1 {
		t.Fatalf("%d publish spans, want 1", len(publishes))
	}
	p := publishes[0]
	if p.SpanKind() != trace.SpanKindProducer || p.Parent().SpanID() != producer.SpanID() || p.SpanContext().TraceID() != producer.TraceID() {
		t.Errorf("publish span of kind %v, parent %v in trace %v; want a producer span, the producer's child",
			p.SpanKind(), p.Parent().SpanID(), p.SpanContext().TraceID())
	}
	wantLinkTo(t, "publish", p, producer)
	wantAttributes(t, "publish", p, semconv.MessagingMessageID(id))
	if got := d.Headers[events.FieldTraceParent]; got != traceParent(p.SpanContext()) {
		t.Errorf("the message's traceparent %v, want the publish span's %s", got, traceParent(p.SpanContext()))
	}
}

// TestTraceKeptAfterRecovery: an event whose claim went stale (its worker
// died before publishing) and that recovery put back to NEW is published
// linked to the producer's span all the same.
func TestTraceKeptAfterRecovery(t *testing.T) {
	t.Parallel()
	tp, rec := recordingProvider(t)
	b := setup(t)
	id, producer := produce(t, tp, b.store)

	// A worker claims the event an hour ago and dies.
	limit := events.ClaimLimit{Events: 10, Bytes: BatchBytesDefault}
	docs, _, err := b.store.ReadClaimable(t.Context(), time.Now(), limit)
	if err != nil || len(docs) != 1 {
		t.Fatalf("ReadClaimable = %d documents, %v; want 1", len(docs), err)
	}
	lease := events.Lease{WorkerID: "crashed", Token: "t-crashed", At: time.Now().Add(-time.Hour).UTC().Truncate(time.Millisecond)}
	if res, err := b.store.ClaimRead(t.Context(), lease, docs, limit); err != nil || len(res.Claimed) != 1 {
		t.Fatalf("ClaimRead = %+v, %v; want the event claimed", res, err)
	}
	if reset, _, err := b.store.RecoverStale(t.Context(), time.Now().Add(-time.Minute), time.Now(), MaxAttemptsDefault); err != nil || reset != 1 {
		t.Fatalf("RecoverStale reset %d, %v; want 1", reset, err)
	}

	c, _ := newClaimer(t, b.store, newPublisher(t, b.exchange), Config{Archetype: service.Archetype{Tracer: tp}})
	runOnce(t, c)
	select {
	case <-b.deliveries:
	case <-time.After(waitFor):
		t.Fatal("the recovered event was not delivered")
	}
	publishes := named(rec, "publish "+b.exchange)
	if len(publishes) != 1 {
		t.Fatalf("%d publish spans, want 1", len(publishes))
	}
	wantLinkTo(t, "publish", publishes[0], producer)
	wantAttributes(t, "publish", publishes[0], semconv.MessagingMessageID(id))
}
