package main

import (
	"context"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/otlpsink"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
)

// envTraceSVG, when set to a file path, makes TestTracingOverOTLP draw
// the producer's trace it recorded into that file (make trace-picture:
// docs/images/trace.svg).
const envTraceSVG = "OUTBOX_TEST_TRACE_SVG"

// TestTracingOverOTLP runs `worker run` with the OTEL_* variables pointing
// its real OTLP/HTTP exporter at a receiver in this test, and checks that
// they are honoured: its spans arrive, with the service name, the resource
// attributes and the worker's instance id, and, with OUTBOX_TRACE_MONGO,
// the database commands as CLIENT spans with the db.* attributes. A
// producer (this test, tracing its insert) and a consumer (this test,
// continuing the message's traceparent) share the producer's trace: the
// worker runs in the opt-in mode where the publish span is the producer
// span's child and the message carries it (the default, links, is
// claim's TestTraceEndToEnd).
func TestTracingOverOTLP(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	s := localStack(t)
	sink := otlpsink.New()
	srv := httptest.NewServer(sink)
	t.Cleanup(srv.Close)

	// The producer's and the consumer's tracing: this test's, exporting to
	// the same receiver, as two services would to one collector.
	producerTP, consumerTP := testProvider(ctx, t, srv.URL, "checkout"), testProvider(ctx, t, srv.URL, "payments")
	client := s.connect(t, 4, func(o *options.ClientOptions) { o.SetMonitor(mongo.CommandTracer(producerTP)) })
	db := uniqueDatabase(t, client)
	coll := db.Collection(mongo.CollectionDefault)
	exchange := testenv.UniqueName(t, "ex_")
	deliveries := testenv.Consume(t, s.amqpURL, exchange)

	workerID := db.Name() + "-w"
	env := s.relayEnv(db.Name(), exchange, workerID)
	for k, v := range map[string]string{
		"OTEL_TRACES_EXPORTER":        "otlp",
		"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL,
		"OTEL_EXPORTER_OTLP_HEADERS":  "x-api-key=otlp-secret-key",
		"OTEL_SERVICE_NAME":           "outbox-relay-e2e",
		"OTEL_RESOURCE_ATTRIBUTES":    "deployment.environment.name=e2e,team=platform",
		"OTEL_BSP_SCHEDULE_DELAY":     "100", // export within 100 ms, not 5 s
		"OUTBOX_TRACE_MONGO":          "true",
		"OUTBOX_TRACE_PARENT":         "child",
		"OUTBOX_TRACE_MESSAGE":        "publish",
		"OUTBOX_LOG_LEVEL":            "info",
	} {
		env[k] = v
	}
	proc := startWorker(t, workerID, env)

	// The producer: its span, the insert of the event under it.
	pctx, checkout := producerTP.Tracer("checkout").Start(ctx, "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
	if _, err := events.Insert(pctx, coll, events.Draft{
		ID: "o-1001-created", Type: "order.created", AggregateType: "order", AggregateID: "o-1001",
		Payload: bson.D{{Key: "total", Value: 42}},
	}); err != nil {
		t.Fatal(err)
	}
	checkout.End()

	// The consumer: it continues the trace the message's headers carry.
	var d amqp.Delivery
	select {
	case d = <-deliveries:
	case <-ctx.Done():
		t.Fatalf("no message within the test's time; worker log:\n%s", proc.Tail(20))
	}
	cctx := propagation.TraceContext{}.Extract(ctx, amqpHeaders(d.Headers))
	if got := trace.SpanContextFromContext(cctx).TraceID(); got != checkout.SpanContext().TraceID() {
		t.Errorf("the message's traceparent %v has trace %s, want the producer's %s", d.Headers["traceparent"], got, checkout.SpanContext().TraceID())
	}
	_, process := consumerTP.Tracer("payments").Start(cctx, "process order.created", trace.WithSpanKind(trace.SpanKindConsumer))
	process.End()
	for _, tp := range []*sdktrace.TracerProvider{producerTP, consumerTP} {
		if err := tp.ForceFlush(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// The worker's spans: its database commands, under its resource.
	testenv.Eventually(t, testenv.WaitTimeout, func() (bool, string) {
		for _, sp := range sink.Spans() {
			if sp.Resource["service.name"] == "outbox-relay-e2e" && sp.Name == "update events" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("no span update events from the worker among %d received", len(sink.Spans()))
	})
	stopWorkers(t, proc) // exports what is queued, last

	var relay []otlpsink.Span
	for _, sp := range sink.Spans() {
		if sp.Resource["service.name"] == "outbox-relay-e2e" {
			relay = append(relay, sp)
		}
	}
	for _, sp := range relay {
		for k, want := range map[string]string{
			"deployment.environment.name": "e2e", "team": "platform", "service.instance.id": workerID,
		} {
			if sp.Resource[k] != want {
				t.Fatalf("span %s: resource %s = %q, want %q (resource %v)", sp.Name, k, sp.Resource[k], want, sp.Resource)
			}
		}
		if strings.HasPrefix(sp.Scope, mongo.TracerName) {
			if sp.Kind != "client" || sp.Attributes["db.system.name"] != "mongodb" || sp.Attributes["db.operation.name"] == "" {
				t.Errorf("database span %s: kind %s, attributes %v; want client, mongodb and the command", sp.Name, sp.Kind, sp.Attributes)
			}
			if name := sp.Attributes["db.collection.name"]; name == mongo.CollectionDefault && sp.Attributes["db.namespace"] != db.Name() {
				t.Errorf("database span %s: db.namespace %q, want %q", sp.Name, sp.Attributes["db.namespace"], db.Name())
			}
		}
	}
	withKey := 0
	for _, h := range sink.Headers() {
		if h.Get("X-Api-Key") == "otlp-secret-key" {
			withKey++
		}
	}
	if withKey == 0 {
		t.Error("no export carried the x-api-key header of OTEL_EXPORTER_OTLP_HEADERS")
	}
	if log, err := os.ReadFile(proc.LogPath()); err != nil {
		t.Error(err)
	} else if strings.Contains(string(log), "otlp-secret-key") {
		t.Errorf("the worker's log shows the OTLP header's value:\n%s", log)
	}
	// The relay's publish span continues the producer's trace, and the
	// consumer continues the publish span's.
	publish, ok := spanNamed(relay, "publish "+exchange)
	switch {
	case !ok:
		t.Errorf("no span publish %s from the worker among %d", exchange, len(relay))
	case publish.Kind != "producer" || publish.TraceID != checkout.SpanContext().TraceID().String() ||
		publish.ParentSpanID != checkout.SpanContext().SpanID().String():
		t.Errorf("publish span: kind %s, trace %s, parent %s; want producer, the producer's trace %s and span %s",
			publish.Kind, publish.TraceID, publish.ParentSpanID, checkout.SpanContext().TraceID(), checkout.SpanContext().SpanID())
	case !slices.Contains(publish.Links, checkout.SpanContext().TraceID().String()+"-"+checkout.SpanContext().SpanID().String()):
		t.Errorf("publish span's links %v, want one to the producer's span", publish.Links)
	case trace.SpanContextFromContext(cctx).SpanID().String() != publish.SpanID:
		t.Errorf("the consumer's parent is %s, want the publish span %s", trace.SpanContextFromContext(cctx).SpanID(), publish.SpanID)
	}

	if path := os.Getenv(envTraceSVG); path != "" {
		drawTrace(t, path, sink.Spans(), checkout.SpanContext().TraceID().String())
	}
}

// testProvider is an SDK provider of service, exporting to the receiver
// at url, shut down in t.Cleanup.
func testProvider(ctx context.Context, t *testing.T, url, service string) *sdktrace.TracerProvider {
	t.Helper()
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(url+otlpsink.Path))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
		sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName(service))))
	t.Cleanup(func() { _ = tp.Shutdown(context.WithoutCancel(ctx)) })
	return tp
}

// amqpHeaders reads a delivery's string headers as a propagation carrier.
type amqpHeaders amqp.Table

func (h amqpHeaders) Get(key string) string {
	s, _ := h[key].(string)
	return s
}

func (h amqpHeaders) Set(key, value string) { h[key] = value }

func (h amqpHeaders) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// spanNamed returns the first of spans named name.
func spanNamed(spans []otlpsink.Span, name string) (otlpsink.Span, bool) {
	for _, s := range spans {
		if s.Name == name {
			return s, true
		}
	}
	return otlpsink.Span{}, false
}

// drawTrace writes the waterfall of traceID to path.
func drawTrace(t *testing.T, path string, spans []otlpsink.Span, traceID string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := otlpsink.Waterfall(f, spans, traceID, "order.created: from the producer's request through the outbox to the consumer"); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", path)
}

// TestTracingCollectorDown: a collector that cannot be reached costs the
// spans, never the relay: every event is delivered, the worker warns
// (without the OTLP header's value) and still stops cleanly, exit 0.
func TestTracingCollectorDown(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	s := localStack(t)
	db, coll, exchange, r := s.relayed(t)
	down := closedAddr(t)

	workerID := db.Name() + "-w"
	env := s.relayEnv(db.Name(), exchange, workerID)
	for k, v := range map[string]string{
		"OTEL_TRACES_EXPORTER":        "otlp",
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + down,
		"OTEL_EXPORTER_OTLP_HEADERS":  "x-api-key=otlp-secret-key",
		"OTEL_BSP_SCHEDULE_DELAY":     "100",
		"OTEL_BSP_EXPORT_TIMEOUT":     "500", // give up on an export within half a second
		"OUTBOX_TRACE_MONGO":          "true",
	} {
		env[k] = v
	}
	proc := startWorker(t, workerID, env)
	ids := insertBacklog(ctx, t, coll, 50, "e2e.traced")
	r.waitDistinct(ctx, t, len(ids))
	testenv.Eventually(t, timeLeft(ctx), func() (bool, string) {
		log, err := os.ReadFile(proc.LogPath())
		return err == nil && strings.Contains(string(log), "tracing: spans not exported"), "no warning about the spans not exported"
	})
	stopWorkers(t, proc)
	r.checkExactly(t, ids)
	log, err := os.ReadFile(proc.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(log), "otlp-secret-key") {
		t.Errorf("the worker's log shows the OTLP header's value:\n%s", log)
	}
	if n := strings.Count(string(log), "tracing: spans not exported\""); n > 2 {
		t.Errorf("%d warnings about unexported spans in one short run, want them rate-limited:\n%s", n, log)
	}
}

// closedAddr is a loopback address nothing listens on any more.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}
