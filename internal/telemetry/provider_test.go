package telemetry

import (
	"log/slog"
	"net/http/httptest"
	"os"
	"slices"
	"testing"

	"go.opentelemetry.io/otel"

	"github.com/outboxrelay/outbox/internal/otlpsink"
)

// TestProviderExportsOverOTLP runs the real OTLP/HTTP exporter against an
// in-test receiver: the spans arrive with the service name, the resource
// attributes and the headers of the OTEL_* variables, and the instance id
// the worker gives. (t.Setenv: the exporter and the SDK read the process's
// environment, so this test cannot run in parallel.)
func TestProviderExportsOverOTLP(t *testing.T) {
	sink := otlpsink.New()
	srv := httptest.NewServer(sink)
	defer srv.Close()
	t.Setenv(EnvTracesExporter, "otlp")
	t.Setenv(EnvEndpoint, srv.URL)
	t.Setenv(EnvServiceName, "relay-under-test")
	t.Setenv(EnvResourceAttrs, "deployment.environment.name=test,team=payments%20ops")
	t.Setenv(EnvHeaders, "api-key=sekrit")
	cfg, err := ConfigFromEnv(os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	cfg.InstanceID = "w-1"
	p, err := New(t.Context(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if !p.Enabled() {
		t.Fatal("Enabled() = false with OTEL_TRACES_EXPORTER=otlp")
	}
	_, span := p.Tracer("test").Start(t.Context(), "hello")
	span.End()
	if err := p.Shutdown(t.Context()); err != nil { // exports what is queued
		t.Fatal(err)
	}

	spans := sink.Spans()
	if len(spans) != 1 || spans[0].Name != "hello" {
		t.Fatalf("received %+v, want the one span hello", spans)
	}
	res := spans[0].Resource
	for k, want := range map[string]string{
		"service.name": "relay-under-test", "deployment.environment.name": "test", "team": "payments ops",
		"service.instance.id": "w-1", "telemetry.sdk.language": "go",
	} {
		if res[k] != want {
			t.Errorf("resource %s = %q, want %q (resource %v)", k, res[k], want, res)
		}
	}
	if h := sink.Headers(); len(h) == 0 || h[0].Get("Api-Key") != "sekrit" {
		t.Errorf("request headers %v, want api-key from %s", h, EnvHeaders)
	}
}

// TestProviderOff: without OTEL_TRACES_EXPORTER (or with none) the
// provider is a no-op one, whose spans record nothing, and its shutdown
// has nothing to do; the global propagator is W3C TraceContext either way.
func TestProviderOff(t *testing.T) {
	for _, env := range []map[string]string{nil, {EnvTracesExporter: "none"}, {EnvTracesExporter: "otlp", EnvSDKDisabled: "true"}} {
		cfg, err := ConfigFromEnv(envOf(env))
		if err != nil {
			t.Fatal(err)
		}
		otel.SetTextMapPropagator(nil)
		p, err := New(t.Context(), cfg, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		_, span := p.Tracer("test").Start(t.Context(), "hello")
		if p.Enabled() || span.IsRecording() || span.SpanContext().IsValid() {
			t.Errorf("%v: Enabled() = %v, span recording %v, valid %v; want a no-op provider", env, p.Enabled(), span.IsRecording(), span.SpanContext().IsValid())
		}
		if err := p.Shutdown(t.Context()); err != nil {
			t.Error(err)
		}
		if got := otel.GetTextMapPropagator().Fields(); !slices.Equal(got, []string{"traceparent", "tracestate"}) {
			t.Errorf("%v: global propagator's fields %v, want traceparent and tracestate", env, got)
		}
	}
}
