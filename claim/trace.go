package claim

import (
	"context"
	"errors"
	"maps"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/outboxrelay/outbox/events"
)

// TracerName is the instrumentation scope of the relay's spans.
const TracerName = "github.com/outboxrelay/outbox/claim"

// Span names and attributes of the relay's own (see the span reference in
// docs/message-contract.md). The messaging attributes are OpenTelemetry's
// semantic conventions for RabbitMQ.
const (
	// SpanClaim is the span of a claim that took events: the read and
	// the write of one batch.
	SpanClaim = "outbox.claim"
	// SpanSettle is the span of the writes that record a batch's outcome.
	SpanSettle = "outbox.settle"
	// AttrWaitMillis is how long an event waited in the outbox, from its
	// createdAt to the start of its publish, in milliseconds (on the
	// database's clock, as createdAt is written).
	AttrWaitMillis = attribute.Key("outbox.wait.duration_ms")
	// AttrWorkerID is the worker (Config.WorkerID) of a batch span.
	AttrWorkerID = attribute.Key("outbox.worker.id")
	// AttrRejected counts the events a claim refused and wrote FAILED.
	AttrRejected = attribute.Key("outbox.claim.rejected")
	// AttrPublished and AttrReleased count the events a settle marked
	// PUBLISHED, and released to NEW or FAILED.
	AttrPublished = attribute.Key("outbox.settle.published")
	AttrReleased  = attribute.Key("outbox.settle.released")
	// AttrLinksDropped counts the events of a batch whose stored context
	// was not linked because the batch had more than MaxBatchLinks.
	AttrLinksDropped = attribute.Key("outbox.links.dropped")
)

// MaxBatchLinks bounds the links of a batch span: the stored contexts of
// the first MaxBatchLinks events of the batch that carry one. (The SDK's
// default span limit is 128 links too.)
const MaxBatchLinks = 128

// Values of Config.TraceParent and Config.TraceMessage.
const (
	TraceParentLink      = "link"
	TraceParentChild     = "child"
	TraceMessageProducer = "producer"
	TraceMessagePublish  = "publish"
)

// tracing starts the relay's spans. Its zero value, or one built on a
// no-op provider, is off: nothing is started, nothing allocated, and each
// message carries its event's stored context unchanged.
type tracing struct {
	on       bool
	tracer   trace.Tracer
	child    bool          // Config.TraceParent is TraceParentChild
	inject   bool          // Config.TraceMessage is TraceMessagePublish
	exchange string        // the publisher's, "" when it does not say
	node     func() string // the publisher's broker node, when it says
	publish  string        // the publish span's name
	workerID string
}

// exchanger is a Publisher that names its exchange (broker.Publisher).
type exchanger interface{ Exchange() string }

// noder is a Publisher that names the broker node it is connected to, as
// a URL (broker.Publisher).
type noder interface{ Node() string }

func newTracing(cfg Config, pub Publisher) tracing {
	if isNoop(cfg.Tracer) {
		return tracing{}
	}
	t := tracing{on: true, tracer: cfg.Tracer.Tracer(TracerName), workerID: cfg.WorkerID, publish: events.OperationPublish,
		child: cfg.TraceParent == TraceParentChild, inject: cfg.TraceMessage == TraceMessagePublish}
	if e, ok := pub.(exchanger); ok {
		t.exchange = e.Exchange()
	}
	if n, ok := pub.(noder); ok {
		t.node = n.Node
	}
	if t.exchange != "" {
		// {operation name} {destination}; the default exchange has no name.
		t.publish += " " + t.exchange
	}
	return t
}

// isNoop reports whether tp can only make non-recording spans, so that the
// relay need not start any.
func isNoop(tp trace.TracerProvider) bool {
	switch tp.(type) {
	case nil, noop.TracerProvider, *noop.TracerProvider:
		return true
	}
	return false
}

// w3c is the W3C TraceContext propagator: traceparent and tracestate.
var w3c propagation.TraceContext

// storedSpanContext parses a W3C trace context, from a message's headers
// or an event document; it is the zero (invalid) SpanContext when there is
// none or it does not parse.
func storedSpanContext(carrier propagation.TextMapCarrier) trace.SpanContext {
	// The propagator only parses: a blank context keeps any span the
	// caller's context carries from standing in for a missing one.
	return trace.SpanContextFromContext(w3c.Extract(context.Background(), carrier))
}

// headerCarrier is a message's headers as a propagation.TextMapCarrier.
type headerCarrier map[string]any

func (h headerCarrier) Get(key string) string {
	s, _ := h[key].(string)
	return s
}

func (h headerCarrier) Set(key, value string) { h[key] = value }

func (h headerCarrier) Keys() []string {
	return []string{events.FieldTraceParent, events.FieldTraceState}
}

// docCarrier reads an event document's traceparent and tracestate fields.
type docCarrier bson.Raw

func (d docCarrier) Get(key string) string {
	s, _ := bson.Raw(d).Lookup(key).StringValueOK()
	return s
}

func (docCarrier) Set(string, string) {}

func (docCarrier) Keys() []string {
	return []string{events.FieldTraceParent, events.FieldTraceState}
}

// publishMessages publishes batch, each message in a span of its own
// when tracing is on (startPublish), and ends the spans with the results.
func (c *Claimer) publishMessages(ctx context.Context, batch []events.Message) []error {
	if !c.trace.on {
		return c.pub.Publish(ctx, batch)
	}
	spans := c.trace.startPublish(ctx, batch, c.now())
	errs := c.pub.Publish(ctx, batch)
	endPublish(spans, errs)
	return errs
}

// startPublish starts one span per message of batch at now (the
// database's clock), as the messaging conventions describe a send span
// for a message that carries a creation context of its own: it links to
// the event's stored context, and its parent is ctx (or, with
// TraceParentChild, the stored context). The message keeps carrying the
// stored context (the span is then of kind CLIENT) unless TraceMessage
// is TraceMessagePublish or it has none: then a recording span, of kind
// PRODUCER, puts its own context in its place, in a copy of its
// headers. A span that does not record (not sampled) leaves the message
// as it was. It returns the spans, nil where one does not record.
func (t tracing) startPublish(ctx context.Context, batch []events.Message, now time.Time) []trace.Span {
	var server string
	if t.node != nil {
		server = events.BrokerServer(t.node())
	}
	spans := make([]trace.Span, len(batch))
	for j := range batch {
		m := &batch[j]
		stored := storedSpanContext(headerCarrier(m.Headers))
		inject := t.inject || !stored.IsValid()
		kind := trace.SpanKindClient
		if inject {
			kind = trace.SpanKindProducer
		}
		attrs := events.MessagingSpan{Operation: events.OperationPublish, Exchange: t.exchange, RoutingKey: m.Type,
			MessageID: m.ID, BodySize: len(m.Body), Server: server}.Attributes()
		opts := []trace.SpanStartOption{
			trace.WithSpanKind(kind),
			trace.WithAttributes(attrs...),
			trace.WithAttributes(AttrWaitMillis.Int64(now.Sub(m.Timestamp).Milliseconds())),
		}
		parent := ctx
		if stored.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: stored}))
			if t.child {
				parent = trace.ContextWithRemoteSpanContext(ctx, stored)
			}
		}
		spanCtx, span := t.tracer.Start(parent, t.publish, opts...)
		if !span.IsRecording() {
			span.End()
			continue
		}
		spans[j] = span
		if inject {
			headers := make(map[string]any, len(m.Headers)+2)
			maps.Copy(headers, m.Headers)
			delete(headers, events.FieldTraceParent)
			delete(headers, events.FieldTraceState)
			w3c.Inject(spanCtx, headerCarrier(headers))
			m.Headers = headers
		}
	}
	return spans
}

// endPublish ends the publish spans with their messages' results: an
// error sets the span's status and error.type.
func endPublish(spans []trace.Span, errs []error) {
	for j, span := range spans {
		if span == nil {
			continue
		}
		if err := errs[j]; err != nil {
			span.SetAttributes(semconv.ErrorTypeKey.String(publishErrorType(err)))
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

// publishErrorType is a publish failure's error.type: the kind the
// publisher reports (events' publish errors), or _OTHER.
func publishErrorType(err error) string {
	for _, k := range []struct {
		err  error
		kind string
	}{
		{events.ErrNacked, "nacked"},
		{events.ErrReturned, "returned"},
		{events.ErrUnconfirmed, "unconfirmed"},
		{events.ErrUnavailable, "unavailable"},
		{events.ErrRejected, "rejected"},
	} {
		if errors.Is(err, k.err) {
			return k.kind
		}
	}
	if isInvalid(err) {
		return "invalid"
	}
	return semconv.ErrorTypeOther.Value.AsString()
}

// batchLinks returns links to the stored contexts of the first
// MaxBatchLinks of docs that carry a valid one, and how many more were
// left out.
func batchLinks(docs []bson.Raw) (links []trace.Link, dropped int) {
	for _, doc := range docs {
		sc := storedSpanContext(docCarrier(doc))
		if !sc.IsValid() {
			continue
		}
		if len(links) == MaxBatchLinks {
			dropped++
			continue
		}
		links = append(links, trace.Link{SpanContext: sc})
	}
	return links, dropped
}

// claimedDocs returns the documents of a claimed batch.
func claimedDocs(claimed []events.Claimed) []bson.Raw {
	docs := make([]bson.Raw, len(claimed))
	for i, cl := range claimed {
		docs[i] = cl.Doc
	}
	return docs
}

// recordClaim records a claim that took or refused events, or failed, as
// a span from start to end (local clock): started after the fact, so that
// the claims of an idle relay, every tick, make no spans.
func (t tracing) recordClaim(ctx context.Context, start, end time.Time, res events.ClaimResult, err error) {
	if !t.on || (err == nil && len(res.Claimed) == 0 && len(res.Rejected) == 0) {
		return
	}
	links, dropped := batchLinks(claimedDocs(res.Claimed))
	_, span := t.tracer.Start(ctx, SpanClaim,
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithTimestamp(start),
		trace.WithLinks(links...),
		trace.WithAttributes(
			AttrWorkerID.String(t.workerID),
			semconv.MessagingBatchMessageCount(len(res.Claimed)),
			AttrRejected.Int(len(res.Rejected)),
			AttrLinksDropped.Int(dropped),
		))
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End(trace.WithTimestamp(end))
}

// startSettle starts the span of a batch's outcome writes, linked to its
// events' stored contexts; the returned function ends it.
func (t tracing) startSettle(ctx context.Context, claimed []events.Claimed, outcomes []outcome) (context.Context, func(error)) {
	if !t.on {
		return ctx, func(error) {}
	}
	published := 0
	for _, o := range outcomes {
		if o.err == nil {
			published++
		}
	}
	links, dropped := batchLinks(claimedDocs(claimed))
	ctx, span := t.tracer.Start(ctx, SpanSettle,
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithLinks(links...),
		trace.WithAttributes(
			AttrWorkerID.String(t.workerID),
			semconv.MessagingBatchMessageCount(len(outcomes)),
			AttrPublished.Int(published),
			AttrReleased.Int(len(outcomes)-published),
			AttrLinksDropped.Int(dropped),
		))
	return ctx, func(err error) {
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}
