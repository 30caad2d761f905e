package telemetry

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// The variables this package reads itself, through the getenv it is
// given. The SDK and the OTLP exporters read the others (see doc.go).
const (
	EnvSDKDisabled       = "OTEL_SDK_DISABLED"
	EnvTracesExporter    = "OTEL_TRACES_EXPORTER"
	EnvProtocol          = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol    = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	EnvEndpoint          = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint    = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvHeaders           = "OTEL_EXPORTER_OTLP_HEADERS"
	EnvTracesHeaders     = "OTEL_EXPORTER_OTLP_TRACES_HEADERS"
	EnvTimeout           = "OTEL_EXPORTER_OTLP_TIMEOUT"
	EnvTracesTimeout     = "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"
	EnvCompression       = "OTEL_EXPORTER_OTLP_COMPRESSION"
	EnvTracesCompression = "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"
	EnvSampler           = "OTEL_TRACES_SAMPLER"
	EnvSamplerArg        = "OTEL_TRACES_SAMPLER_ARG"
	EnvServiceName       = "OTEL_SERVICE_NAME"
	EnvResourceAttrs     = "OTEL_RESOURCE_ATTRIBUTES"
)

// Values of OTEL_TRACES_EXPORTER and of the OTLP protocol variables.
const (
	ExporterOTLP = "otlp"
	ExporterNone = "none"

	ProtocolHTTPProtobuf = "http/protobuf"
	ProtocolHTTPJSON     = "http/json"
	ProtocolGRPC         = "grpc"
)

// ServiceNameDefault is service.name when OTEL_SERVICE_NAME (and
// OTEL_RESOURCE_ATTRIBUTES) name none.
const ServiceNameDefault = "outbox-worker"

// Config is what the worker's tracing is, as read from the OTEL_*
// variables by ConfigFromEnv.
type Config struct {
	// Enabled is OTEL_TRACES_EXPORTER=otlp without OTEL_SDK_DISABLED=true.
	// Off, the worker uses a no-op provider. Defaults to false.
	Enabled bool
	// Protocol is the OTLP protocol: ProtocolHTTPProtobuf (the default),
	// ProtocolHTTPJSON or ProtocolGRPC.
	Protocol string
	// InstanceID is the resource's service.instance.id (the worker's
	// id); "" leaves it out. OTEL_RESOURCE_ATTRIBUTES may override it.
	InstanceID string
	// ServiceVersion is the resource's service.version (the worker's
	// version, as worker version prints it); "" leaves it out.
	// OTEL_RESOURCE_ATTRIBUTES may override it.
	ServiceVersion string
	// Secrets are the values of the OTLP headers (API keys): every log
	// line of the SDK has them replaced by xxxxx before it is written.
	Secrets []string
}

// VariableError is a variable whose value is refused. Value is "" when
// the value must not be shown (the headers hold API keys).
type VariableError struct {
	Name, Value, Want string
	// Secret: Value was left out on purpose.
	Secret bool
}

func (e *VariableError) Error() string {
	if e.Secret {
		return fmt.Sprintf("invalid %s <redacted>: %s", e.Name, e.Want)
	}
	return fmt.Sprintf("invalid %s %q: %s", e.Name, e.Value, e.Want)
}

// samplers are the values of OTEL_TRACES_SAMPLER the Go SDK knows; true
// for those that take OTEL_TRACES_SAMPLER_ARG.
var samplers = map[string]bool{
	"always_on": false, "always_off": false, "traceidratio": true,
	"parentbased_always_on": false, "parentbased_always_off": false, "parentbased_traceidratio": true,
}

// ConfigFromEnv reads and checks the OTEL_* variables through getenv. It
// checks more than it uses: the SDK and the exporters read the process's
// environment themselves and, given a value they cannot use, log it and go
// on with their default; the worker refuses such a value at start instead,
// naming the variable. Tracing is off unless OTEL_TRACES_EXPORTER is otlp.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	get := func(name string) string { return strings.TrimSpace(getenv(name)) }
	var c Config
	disabled := get(EnvSDKDisabled)
	switch strings.ToLower(disabled) {
	case "", "false":
	case "true":
		return Config{}, nil
	default:
		return Config{}, &VariableError{Name: EnvSDKDisabled, Value: disabled, Want: "want true or false"}
	}
	switch exporter := get(EnvTracesExporter); exporter {
	case "", ExporterNone:
		return Config{}, nil
	case ExporterOTLP:
		c.Enabled = true
	default:
		return Config{}, &VariableError{Name: EnvTracesExporter, Value: exporter,
			Want: "want otlp or none (unset: none, no tracing)"}
	}
	c.Protocol = ProtocolHTTPProtobuf
	for _, name := range []string{EnvProtocol, EnvTracesProtocol} { // the per-signal one wins
		switch v := get(name); v {
		case "":
		case ProtocolHTTPProtobuf, ProtocolHTTPJSON, ProtocolGRPC:
			c.Protocol = v
		default:
			return Config{}, &VariableError{Name: name, Value: v, Want: "want http/protobuf, http/json or grpc"}
		}
	}
	for _, name := range []string{EnvEndpoint, EnvTracesEndpoint} {
		if err := checkEndpoint(name, get(name)); err != nil {
			return Config{}, err
		}
	}
	for _, name := range []string{EnvHeaders, EnvTracesHeaders} {
		values, err := parseHeaders(name, getenv(name))
		if err != nil {
			return Config{}, err
		}
		c.Secrets = append(c.Secrets, values...)
	}
	for _, name := range []string{EnvTimeout, EnvTracesTimeout} {
		if v := get(name); v != "" {
			if n, err := strconv.Atoi(v); err != nil || n < 0 {
				return Config{}, &VariableError{Name: name, Value: v, Want: "want a whole number of milliseconds, such as 10000"}
			}
		}
	}
	for _, name := range []string{EnvCompression, EnvTracesCompression} {
		if v := get(name); v != "" && v != "gzip" && v != "none" {
			return Config{}, &VariableError{Name: name, Value: v, Want: "want gzip or none"}
		}
	}
	if err := checkSampler(get(EnvSampler), get(EnvSamplerArg)); err != nil {
		return Config{}, err
	}
	if _, err := parseResourceAttributes(getenv(EnvResourceAttrs)); err != nil {
		return Config{}, err
	}
	return c, nil
}

// checkEndpoint accepts an unset endpoint (the exporter's default:
// localhost:4318 over HTTP, localhost:4317 over gRPC) or an http or
// https URL with a host. The error never shows the URL's password.
func checkEndpoint(name, v string) error {
	if v == "" {
		return nil
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		shown := "<unparsable>"
		if err == nil {
			shown = u.Redacted()
		}
		return &VariableError{Name: name, Value: shown, Want: "want an http:// or https:// URL such as http://collector:4318"}
	}
	return nil
}

// checkSampler accepts what the SDK's samplerFromEnv accepts, and refuses
// what it would log and replace by its default: an unknown sampler, or a
// ratio that is not a number from 0 to 1.
func checkSampler(sampler, arg string) error {
	if sampler == "" {
		return nil
	}
	takesArg, ok := samplers[strings.ToLower(sampler)]
	if !ok {
		return &VariableError{Name: EnvSampler, Value: sampler,
			Want: "want always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio"}
	}
	if takesArg && arg != "" {
		if r, err := strconv.ParseFloat(arg, 64); err != nil || r < 0 || r > 1 {
			return &VariableError{Name: EnvSamplerArg, Value: arg, Want: "want a ratio from 0 to 1, such as 0.25"}
		}
	}
	return nil
}

// parseHeaders checks OTLP headers as the exporters read them
// (key=value pairs separated by commas, values percent-encoded) and
// returns their values, which are secrets: an error names the variable
// and the pair's place, never the value.
func parseHeaders(name, v string) ([]string, error) {
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	var values []string
	for i, pair := range strings.Split(v, ",") {
		key, value, ok := strings.Cut(pair, "=")
		key = strings.TrimSpace(key)
		if !ok || !isToken(key) {
			return nil, &VariableError{Name: name, Secret: true,
				Want: fmt.Sprintf("want key=value pairs separated by commas (pair %d is not one)", i+1)}
		}
		unescaped, err := url.PathUnescape(value)
		if err != nil {
			return nil, &VariableError{Name: name, Secret: true,
				Want: fmt.Sprintf("the value of %s is not percent-encoded correctly", key)}
		}
		// Both forms: a log line may quote either.
		for _, s := range []string{strings.TrimSpace(unescaped), strings.TrimSpace(value)} {
			if s != "" && !slices.Contains(values, s) {
				values = append(values, s)
			}
		}
	}
	return values, nil
}

// isToken reports whether s is an HTTP header name (RFC 9110 token).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r > 0x7e || r <= ' ' || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r) {
			return false
		}
	}
	return true
}

// parseResourceAttributes reads OTEL_RESOURCE_ATTRIBUTES as the SDK does
// (key=value pairs separated by commas, values percent-encoded) and
// refuses what the SDK would log and drop.
func parseResourceAttributes(v string) (map[string]string, error) {
	attrs := map[string]string{}
	if strings.TrimSpace(v) == "" {
		return attrs, nil
	}
	for i, pair := range strings.Split(v, ",") {
		key, value, ok := strings.Cut(pair, "=")
		key = strings.TrimSpace(key)
		if !ok || key == "" {
			return nil, &VariableError{Name: EnvResourceAttrs, Value: v,
				Want: fmt.Sprintf("want key=value pairs separated by commas (pair %d is not one)", i+1)}
		}
		unescaped, err := url.PathUnescape(strings.TrimSpace(value))
		if err != nil {
			return nil, &VariableError{Name: EnvResourceAttrs, Value: v,
				Want: fmt.Sprintf("the value of %s is not percent-encoded correctly", key)}
		}
		attrs[key] = unescaped
	}
	return attrs, nil
}
