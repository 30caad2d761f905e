// Package telemetry makes the worker's OpenTelemetry tracer provider from
// the standard OTEL_* environment variables. Tracing is off unless
// OTEL_TRACES_EXPORTER=otlp: then the provider is the SDK's, with a batch
// span processor exporting over OTLP (HTTP with protobuf by default,
// OTEL_EXPORTER_OTLP_PROTOCOL=grpc for gRPC); off, it is a no-op provider
// and the relay pays nothing for its spans.
//
// What reads which variable:
//
//   - this package (ConfigFromEnv): OTEL_SDK_DISABLED, OTEL_TRACES_EXPORTER,
//     OTEL_EXPORTER_OTLP_PROTOCOL and OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
//     which choose the exporter; and it checks the variables below that
//     it can, so that a bad value stops the worker at start rather than
//     being logged and replaced by a default;
//   - the OTLP exporters: OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, _HEADERS,
//     _TIMEOUT, _COMPRESSION, _INSECURE, _CERTIFICATE, _CLIENT_CERTIFICATE,
//     _CLIENT_KEY (and the HTTP exporter the protocol, for http/json);
//   - the SDK: OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG, OTEL_BSP_*,
//     the span limits (OTEL_SPAN_*_LIMIT, OTEL_ATTRIBUTE_*_LIMIT, ...),
//     and for the resource OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
//
// Only cmd/worker calls it, with os.Getenv: the exporters and the SDK
// read the process's environment whatever getenv says.
package telemetry
