package telemetry

import (
	"context"
	"fmt"
	"log/slog"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Provider is the worker's tracer provider: the SDK's, exporting over
// OTLP, or a no-op one when tracing is off.
type Provider struct {
	trace.TracerProvider
	sdk *sdktrace.TracerProvider // nil when off
}

// New makes the provider cfg describes and sets the W3C TraceContext
// propagator as the global one, whether tracing is on or not: it is what
// the producer wrote into the event and what consumers read. With tracing
// on it also routes the SDK's errors and log lines to logger, as warnings,
// at most one a minute for repeated ones, with the OTLP headers' values
// replaced (see errorHandler): an export that fails is never fatal.
//
// The exporter, the sampler and the batch span processor read their own
// variables from the process's environment (doc.go lists them);
// ConfigFromEnv has checked those it could through its getenv.
func New(ctx context.Context, cfg Config, logger *slog.Logger) (*Provider, error) {
	otel.SetTextMapPropagator(propagation.TraceContext{})
	if !cfg.Enabled {
		return &Provider{TracerProvider: noop.NewTracerProvider()}, nil
	}
	h := newErrorHandler(logger, cfg.Secrets, nil)
	otel.SetErrorHandler(h)
	otel.SetLogger(h.logr())
	exporter, err := newExporter(ctx, cfg.Protocol)
	if err != nil {
		return nil, fmt.Errorf("otlp trace exporter: %w", err)
	}
	res, err := newResource(ctx, cfg.InstanceID, cfg.ServiceVersion)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EnvResourceAttrs, err)
	}
	sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res))
	return &Provider{TracerProvider: sdk, sdk: sdk}, nil
}

// Enabled reports whether spans are recorded and exported.
func (p *Provider) Enabled() bool { return p.sdk != nil }

// Shutdown exports the spans still queued and stops the exporter, within
// ctx; a provider that is off has nothing to do. After it the provider
// records nothing.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p.sdk == nil {
		return nil
	}
	return p.sdk.Shutdown(ctx)
}

// newExporter is the OTLP exporter of protocol. Both read the endpoint,
// headers, timeout, compression and TLS variables themselves; the HTTP one
// also reads the protocol to choose protobuf or JSON.
func newExporter(ctx context.Context, protocol string) (sdktrace.SpanExporter, error) {
	if protocol == ProtocolGRPC {
		return otlptracegrpc.New(ctx)
	}
	return otlptracehttp.New(ctx)
}

// newResource describes this worker: service.name outbox-worker,
// service.instance.id its worker id, service.version its version (as
// stamped into a release, the same as worker version and
// outbox_build_info say), the SDK's own attributes, then what
// OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME say, which win.
func newResource(ctx context.Context, instanceID, version string) (*resource.Resource, error) {
	attrs := []resource.Option{resource.WithAttributes(semconv.ServiceName(ServiceNameDefault))}
	if instanceID != "" {
		attrs = append(attrs, resource.WithAttributes(semconv.ServiceInstanceID(instanceID)))
	}
	if version != "" {
		attrs = append(attrs, resource.WithAttributes(semconv.ServiceVersion(version)))
	}
	attrs = append(attrs, resource.WithTelemetrySDK(), resource.WithFromEnv(), resource.WithSchemaURL(semconv.SchemaURL))
	return resource.New(ctx, attrs...)
}
