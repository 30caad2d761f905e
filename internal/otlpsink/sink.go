// Package otlpsink is an OTLP/HTTP receiver of traces that keeps what it
// receives: the collector of the tests that check the worker's OTLP
// export, and the span counter of the benchmark's tracing stage. It
// accepts protobuf requests (gzip-compressed or not) on /v1/traces.
package otlpsink

import (
	"compress/gzip"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Path is where OTLP/HTTP exporters send traces.
const Path = "/v1/traces"

// Span is one received span, flattened: its resource's attributes come
// with it. Attribute values are shown as strings.
type Span struct {
	Name                 string
	Kind                 string // "client", "producer", ...
	TraceID, SpanID      string // lower-case hex
	ParentSpanID         string // "" for a root
	Start, End           time.Time
	Attributes, Resource map[string]string
	Links                []string // the linked spans' trace-span ids
	StatusError          bool
	Scope                string
}

// Sink receives OTLP/HTTP trace exports. Its zero value is ready; serve it
// with net/http (httptest.NewServer(sink) in a test).
type Sink struct {
	// Keep: false only counts spans (the benchmark), true keeps them.
	Keep bool

	mu       sync.Mutex
	spans    []Span
	count    int
	requests int
	headers  []http.Header
}

// New returns a sink that keeps every span.
func New() *Sink { return &Sink{Keep: true} }

// ServeHTTP decodes one export request and answers with an empty, full
// success.
func (s *Sink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != Path {
		http.Error(w, "want POST "+Path, http.StatusNotFound)
		return
	}
	body := io.Reader(r.Body)
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		defer zr.Close()
		body = zr
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(raw, &req); err != nil {
		http.Error(w, fmt.Sprintf("not an OTLP protobuf trace export: %v", err), http.StatusBadRequest)
		return
	}
	s.add(&req, r.Header.Clone())
	out, err := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (s *Sink) add(req *coltracepb.ExportTraceServiceRequest, h http.Header) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests++
	if s.Keep {
		s.headers = append(s.headers, h)
	}
	for _, rs := range req.GetResourceSpans() {
		res := attributes(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				s.count++
				if s.Keep {
					s.spans = append(s.spans, flatten(sp, res, ss.GetScope().GetName()))
				}
			}
		}
	}
}

// Count is the number of spans received.
func (s *Sink) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count
}

// Spans returns a copy of the spans kept, in the order received.
func (s *Sink) Spans() []Span {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Span(nil), s.spans...)
}

// Headers returns the HTTP headers of each request kept.
func (s *Sink) Headers() []http.Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]http.Header(nil), s.headers...)
}

func flatten(sp *tracepb.Span, res map[string]string, scope string) Span {
	out := Span{
		Name:         sp.GetName(),
		Kind:         kinds[sp.GetKind()],
		TraceID:      hex.EncodeToString(sp.GetTraceId()),
		SpanID:       hex.EncodeToString(sp.GetSpanId()),
		ParentSpanID: hex.EncodeToString(sp.GetParentSpanId()),
		Start:        time.Unix(0, int64(sp.GetStartTimeUnixNano())), //nolint:gosec // a time in ns fits
		End:          time.Unix(0, int64(sp.GetEndTimeUnixNano())),   //nolint:gosec // as above
		Attributes:   attributes(sp.GetAttributes()),
		Resource:     res,
		StatusError:  sp.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR,
		Scope:        scope,
	}
	for _, l := range sp.GetLinks() {
		out.Links = append(out.Links, hex.EncodeToString(l.GetTraceId())+"-"+hex.EncodeToString(l.GetSpanId()))
	}
	return out
}

var kinds = map[tracepb.Span_SpanKind]string{
	tracepb.Span_SPAN_KIND_UNSPECIFIED: "unspecified",
	tracepb.Span_SPAN_KIND_INTERNAL:    "internal",
	tracepb.Span_SPAN_KIND_SERVER:      "server",
	tracepb.Span_SPAN_KIND_CLIENT:      "client",
	tracepb.Span_SPAN_KIND_PRODUCER:    "producer",
	tracepb.Span_SPAN_KIND_CONSUMER:    "consumer",
}

func attributes(kvs []*commonpb.KeyValue) map[string]string {
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		out[kv.GetKey()] = value(kv.GetValue())
	}
	return out
}

func value(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return fmt.Sprint(x.IntValue)
	case *commonpb.AnyValue_DoubleValue:
		return fmt.Sprint(x.DoubleValue)
	case *commonpb.AnyValue_BoolValue:
		return fmt.Sprint(x.BoolValue)
	default:
		return fmt.Sprint(v)
	}
}
