package events

import (
	"context"
	"regexp"
	"strings"

	"go.opentelemetry.io/otel/trace"
)

// The W3C trace context an event carries from its producer
// (https://www.w3.org/TR/trace-context/): top-level string fields of the
// event document, so that producers in any language write the same, and
// the message headers of the same names, so that consumers continue the
// producer's trace.
const (
	FieldTraceParent = "traceparent"
	FieldTraceState  = "tracestate"
)

// TraceContext is a W3C trace context: the traceparent and tracestate
// values. The zero value is none.
//
// The rules are W3C Trace Context Level 1 (Recommendation, 23 November
// 2021), the version OpenTelemetry's propagator follows.
type TraceContext struct {
	Parent string
	State  string
}

// traceParentFormat is traceparent: version, trace id, span id and
// flags, in lower-case hex. Later versions may add fields after a dash; a
// reader that knows 00 takes its first four.
var traceParentFormat = regexp.MustCompile(`^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$`)

// The tracestate limits of the recommendation.
const (
	// maxTraceStateMembers is the most list-members a tracestate holds: a
	// longer list does not parse.
	maxTraceStateMembers = 32
	// maxTraceStateKey and maxTraceStateValue bound a list-member's key
	// and value, in characters.
	maxTraceStateKey   = 256
	maxTraceStateValue = 256
	// maxTenantID and maxSystemID bound the two parts of a multi-tenant
	// key, tenant@system.
	maxTenantID = 241
	maxSystemID = 14
	// longTraceStateEntry is the size above which an entry goes first
	// when a tracestate is cut to size.
	longTraceStateEntry = 128
)

// MaxTraceStateBytes bounds the tracestate a message carries. The
// recommendation asks every hop to pass on at least 512 characters and a
// vendor that passes on fewer than a whole list to say how many: the
// relay passes on 1024, twice that, because a message carries the value
// up to twice (its header and the CloudEvents extension) on every
// delivery. A longer tracestate is cut by whole entries (Clean).
const MaxTraceStateBytes = 1024

// Valid reports whether tc's traceparent is well formed: not the reserved
// version ff, nor an all-zero trace or span id, and for version 00
// nothing after the flags. The tracestate does not count: failure to
// parse it must not affect the traceparent (Clean drops it alone).
func (tc TraceContext) Valid() bool {
	m := traceParentFormat.FindStringSubmatch(tc.Parent)
	if m == nil || m[1] == "ff" || (m[1] == "00" && m[5] != "") {
		return false
	}
	return m[2] != "00000000000000000000000000000000" && m[3] != "0000000000000000"
}

// Clean returns tc as a message may carry it, and false when its
// traceparent is not valid (then none: a consumer must never continue a
// trace it cannot parse). A tracestate that does not parse is dropped
// alone, and one longer than MaxTraceStateBytes cut by whole entries:
// those over 128 characters first, then from the end, as the
// recommendation says.
func (tc TraceContext) Clean() (TraceContext, bool) {
	if !tc.Valid() {
		return TraceContext{}, false
	}
	entries, ok := parseTraceState(tc.State)
	if !ok {
		return TraceContext{Parent: tc.Parent}, true
	}
	return TraceContext{Parent: tc.Parent, State: joinTraceState(entries)}, true
}

// parseTraceState returns the list-members of a tracestate, the empty
// ones left out, and false when it does not parse: a list-member that is
// not key=value by the grammar, a key twice, or more than 32 of them.
func parseTraceState(s string) ([]string, bool) {
	var entries []string
	keys := make(map[string]bool)
	for member := range strings.SplitSeq(s, ",") {
		member = strings.Trim(member, " \t")
		if member == "" {
			continue
		}
		key, value, ok := strings.Cut(member, "=")
		if !ok || !traceStateKey(key) || !traceStateValue(value) || keys[key] {
			return nil, false
		}
		keys[key] = true
		if entries = append(entries, member); len(entries) > maxTraceStateMembers {
			return nil, false
		}
	}
	return entries, true
}

// traceStateKey reports whether key is a simple key (a lower-case letter,
// then up to 255 of lower-case letters, digits, _, -, * and /) or a
// multi-tenant one (tenant@system: a tenant id of up to 241 such
// characters starting with a letter or digit, a system id of up to 14
// starting with a letter).
func traceStateKey(key string) bool {
	tenant, system, multi := strings.Cut(key, "@")
	if !multi {
		return len(key) <= maxTraceStateKey && keyPart(key, false)
	}
	return len(tenant) <= maxTenantID && keyPart(tenant, true) &&
		len(system) <= maxSystemID && keyPart(system, false)
}

// keyPart reports whether s is one part of a key: a lower-case letter (or
// a digit, when digitFirst) and then lower-case letters, digits, _, -, *
// and /.
func keyPart(s string, digitFirst bool) bool {
	if s == "" || !isLower(s[0]) && (!digitFirst || !isDigit(s[0])) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !isLower(c) && !isDigit(c) && strings.IndexByte("_-*/", c) < 0 {
			return false
		}
	}
	return true
}

func isLower(c byte) bool { return 'a' <= c && c <= 'z' }

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// traceStateValue reports whether v is a value: 1 to 256 printable ASCII
// characters but , and =, the last not a space.
func traceStateValue(v string) bool {
	if v == "" || len(v) > maxTraceStateValue || v[len(v)-1] == ' ' {
		return false
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c > 0x7e || c == ',' || c == '=' {
			return false
		}
	}
	return true
}

// joinTraceState joins entries with commas, first leaving out whole
// entries until the result fits MaxTraceStateBytes: those longer than
// 128 characters, the right-most first, then the right-most ones.
func joinTraceState(entries []string) string {
	size := len(entries) - 1
	for _, e := range entries {
		size += len(e)
	}
	for i := len(entries) - 1; i >= 0 && size > MaxTraceStateBytes; i-- {
		if len(entries[i]) > longTraceStateEntry {
			size -= len(entries[i]) + 1
			entries = append(entries[:i], entries[i+1:]...)
		}
	}
	for size > MaxTraceStateBytes && len(entries) > 0 {
		size -= len(entries[len(entries)-1]) + 1
		entries = entries[:len(entries)-1]
	}
	return strings.Join(entries, ",")
}

// TraceContextFrom returns the trace context of the span in ctx (an
// OpenTelemetry span, or a remote span context a propagator extracted),
// or none when ctx carries no valid one.
func TraceContextFrom(ctx context.Context) TraceContext {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return TraceContext{}
	}
	return TraceContext{
		Parent: "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String(),
		State:  sc.TraceState().String(),
	}
}
