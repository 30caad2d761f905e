package telemetry

import (
	"context"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"slices"
	"sync"
	"testing"

	"go.opentelemetry.io/otel"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

	"github.com/outboxrelay/outbox/internal/otlpsink"
)

// TestProviderExportsOverOTLP runs the real OTLP/HTTP exporter against an
// in-test receiver: the spans arrive with the service name, the resource
// attributes and the headers of the OTEL_* variables, and the instance id
// and version the worker gives. (t.Setenv: the exporter and the SDK read the process's
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
	cfg.ServiceVersion = "v9.8.7"
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
		"service.instance.id": "w-1", "service.version": "v9.8.7", "telemetry.sdk.language": "go",
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

// grpcReceiver is an OTLP/gRPC trace receiver that keeps the spans' names
// and their resources' service names.
type grpcReceiver struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	names []string
}

func (g *grpcReceiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				g.names = append(g.names, service+"/"+s.GetName())
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// TestProviderExportsOverGRPC: OTEL_EXPORTER_OTLP_PROTOCOL=grpc selects
// the gRPC exporter, which reaches an OTLP/gRPC receiver.
func TestProviderExportsOverGRPC(t *testing.T) {
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	recv := &grpcReceiver{}
	coltracepb.RegisterTraceServiceServer(srv, recv)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Error(err)
		}
	}()
	t.Setenv(EnvTracesExporter, "otlp")
	t.Setenv(EnvProtocol, "grpc")
	t.Setenv(EnvEndpoint, "http://"+ln.Addr().String()) // http: plain text
	cfg, err := ConfigFromEnv(os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(t.Context(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	_, span := p.Tracer("test").Start(t.Context(), "over grpc")
	span.End()
	if err := p.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	recv.mu.Lock()
	defer recv.mu.Unlock()
	if !slices.Equal(recv.names, []string{ServiceNameDefault + "/over grpc"}) {
		t.Errorf("received %q, want the one span of %s", recv.names, ServiceNameDefault)
	}
}
