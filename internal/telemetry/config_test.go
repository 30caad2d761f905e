package telemetry

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestConfigFromEnv(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		env  map[string]string
		want Config
	}{
		"unset is off":         {env: nil, want: Config{}},
		"none is off":          {env: map[string]string{EnvTracesExporter: "none"}, want: Config{}},
		"disabled wins":        {env: map[string]string{EnvTracesExporter: "otlp", EnvSDKDisabled: "TRUE"}, want: Config{}},
		"off ignores the rest": {env: map[string]string{EnvProtocol: "carrier-pigeon"}, want: Config{}},
		"otlp over http by default": {
			env:  map[string]string{EnvTracesExporter: "otlp", EnvSDKDisabled: "false"},
			want: Config{Enabled: true, Protocol: ProtocolHTTPProtobuf},
		},
		"grpc": {
			env:  map[string]string{EnvTracesExporter: "otlp", EnvProtocol: "grpc"},
			want: Config{Enabled: true, Protocol: ProtocolGRPC},
		},
		"the traces protocol wins": {
			env:  map[string]string{EnvTracesExporter: "otlp", EnvProtocol: "grpc", EnvTracesProtocol: "http/json"},
			want: Config{Enabled: true, Protocol: ProtocolHTTPJSON},
		},
		"everything valid": {
			env: map[string]string{
				EnvTracesExporter: "otlp", EnvEndpoint: "https://collector:4318", EnvTracesEndpoint: "http://c:4318/v1/traces",
				EnvHeaders: "api-key=s%3Dcret, x-team = ops", EnvTimeout: "5000", EnvCompression: "gzip",
				EnvSampler: "parentbased_traceidratio", EnvSamplerArg: "0.25",
				EnvResourceAttrs: "deployment.environment.name=prod,k8s.pod.name=w-1", EnvServiceName: "relay",
			},
			want: Config{Enabled: true, Protocol: ProtocolHTTPProtobuf, Secrets: []string{"s=cret", "s%3Dcret", "ops"}},
		},
		"a ratio's argument is ignored by samplers without one": {
			env:  map[string]string{EnvTracesExporter: "otlp", EnvSampler: "always_on", EnvSamplerArg: "x"},
			want: Config{Enabled: true, Protocol: ProtocolHTTPProtobuf},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := ConfigFromEnv(envOf(tt.env))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

// TestConfigFromEnvRefuses: a value the SDK or an exporter would log and
// replace by its default is refused, naming the variable; a header's
// value is never shown.
func TestConfigFromEnvRefuses(t *testing.T) {
	t.Parallel()
	on := func(kv ...string) map[string]string {
		m := map[string]string{EnvTracesExporter: "otlp"}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	tests := map[string]struct {
		env      map[string]string
		variable string
		want     string
	}{
		"unknown exporter":     {map[string]string{EnvTracesExporter: "jaeger"}, EnvTracesExporter, `"jaeger": want otlp or none`},
		"a list of exporters":  {map[string]string{EnvTracesExporter: "otlp,console"}, EnvTracesExporter, "want otlp or none"},
		"bad disabled":         {map[string]string{EnvSDKDisabled: "yes"}, EnvSDKDisabled, "want true or false"},
		"unknown protocol":     {on(EnvProtocol, "http"), EnvProtocol, "want http/protobuf, http/json or grpc"},
		"unknown traces proto": {on(EnvTracesProtocol, "udp"), EnvTracesProtocol, "want http/protobuf"},
		"endpoint no scheme":   {on(EnvEndpoint, "collector:4318"), EnvEndpoint, "want an http:// or https:// URL"},
		"endpoint password":    {on(EnvTracesEndpoint, "ftp://u:hunter2@c"), EnvTracesEndpoint, `"ftp://u:xxxxx@c"`},
		"timeout":              {on(EnvTimeout, "10s"), EnvTimeout, "want a whole number of milliseconds"},
		"compression":          {on(EnvTracesCompression, "zstd"), EnvTracesCompression, "want gzip or none"},
		"sampler":              {on(EnvSampler, "xray"), EnvSampler, "want always_on"},
		"sampler ratio":        {on(EnvSampler, "traceidratio", EnvSamplerArg, "1.5"), EnvSamplerArg, "want a ratio from 0 to 1"},
		"resource attributes":  {on(EnvResourceAttrs, "a=1,b"), EnvResourceAttrs, "pair 2 is not one"},
		"header without =":     {on(EnvHeaders, "api-key"), EnvHeaders, "invalid OTEL_EXPORTER_OTLP_HEADERS <redacted>"},
		"header bad escape":    {on(EnvTracesHeaders, "api-key=hunter2%zz"), EnvTracesHeaders, "not percent-encoded"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := ConfigFromEnv(envOf(tt.env))
			var ve *VariableError
			if !errors.As(err, &ve) {
				t.Fatalf("err = %v, want a *VariableError", err)
			}
			if ve.Name != tt.variable || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), tt.variable) {
				t.Errorf("err = %q, want one naming %s and saying %q", err, tt.variable, tt.want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("err = %q shows a secret", err)
			}
		})
	}
}
