package events_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/outbox/events"
)

// traceNow is the tests' creation time.
var traceNow = time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC)

const (
	goodParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	goodState  = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
)

func TestTraceContextValid(t *testing.T) {
	t.Parallel()
	for name, tt := range map[string]struct {
		tc   events.TraceContext
		want bool
	}{
		"version 00":                       {events.TraceContext{Parent: goodParent, State: goodState}, true},
		"no tracestate":                    {events.TraceContext{Parent: goodParent}, true},
		"a later version with more fields": {events.TraceContext{Parent: "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"}, true},
		"version 00 with more fields":      {events.TraceContext{Parent: goodParent + "-extra"}, false},
		"version ff":                       {events.TraceContext{Parent: "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}, false},
		"upper case":                       {events.TraceContext{Parent: strings.ToUpper(goodParent)}, false},
		"zero trace id":                    {events.TraceContext{Parent: "00-00000000000000000000000000000000-00f067aa0ba902b7-01"}, false},
		"zero span id":                     {events.TraceContext{Parent: "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"}, false},
		"short":                            {events.TraceContext{Parent: "00-4bf92f35-00f067aa0ba902b7-01"}, false},
		"none":                             {events.TraceContext{}, false},
		"tracestate without traceparent":   {events.TraceContext{State: goodState}, false},
		// Failure to parse tracestate must not affect traceparent.
		"tracestate too long":  {events.TraceContext{Parent: goodParent, State: strings.Repeat("a", 9000)}, true},
		"tracestate not ASCII": {events.TraceContext{Parent: goodParent, State: "k=vé"}, true},
	} {
		if got := tt.tc.Valid(); got != tt.want {
			t.Errorf("%s: Valid(%+v) = %t, want %t", name, tt.tc, got, tt.want)
		}
	}
}

// members returns n tracestate list-members kNN=v...v, each of size
// bytes (at least 5).
func members(n, size int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("k%02d=%s", i+1, strings.Repeat("v", size-4))
	}
	return out
}

// TestTraceContextClean: a bad tracestate goes alone, by the limits of
// the recommendation; a long one is cut by whole entries, those over 128
// characters first, then from the end.
func TestTraceContextClean(t *testing.T) {
	t.Parallel()
	key256, value256 := strings.Repeat("z", 256), strings.Repeat("v", 256)
	thirtyTwo := strings.Join(members(32, 8), ",")
	// Ten entries of 100 bytes fit (1009 bytes); one of 200 in the middle
	// does not, and goes first.
	ten := members(10, 100)
	long := append(append(append([]string{}, ten[:5]...), "big="+strings.Repeat("v", 196)), ten[5:]...)
	for name, tt := range map[string]struct {
		state, want string
	}{
		"none":                                    {"", ""},
		"good":                                    {goodState, goodState},
		"spaces and empty members go":             {" rojo=1 ,\t, congo=2\t", "rojo=1,congo=2"},
		"32 members":                              {thirtyTwo, thirtyTwo},
		"33 members: dropped":                     {thirtyTwo + ",k33=1", ""},
		"a key of 256":                            {key256 + "=1", key256 + "=1"},
		"a key of 257: dropped":                   {"z" + key256 + "=1", ""},
		"a value of 256":                          {"k=" + value256, "k=" + value256},
		"a value of 257: dropped":                 {"k=v" + value256, ""},
		"a tenant of 241 and a system of 14":      {strings.Repeat("t", 241) + "@" + strings.Repeat("s", 14) + "=1", strings.Repeat("t", 241) + "@" + strings.Repeat("s", 14) + "=1"},
		"a system of 15: dropped":                 {"t@" + strings.Repeat("s", 15) + "=1", ""},
		"a key twice: dropped":                    {"k=1,k=2", ""},
		"not ASCII: dropped":                      {"k=vé", ""},
		"upper case key: dropped":                 {"K=1", ""},
		"no equals sign: dropped":                 {"rojo", ""},
		"too long: the entry over 128 goes first": {strings.Join(long, ","), strings.Join(ten, ",")},
		"too long: then from the end":             {strings.Join(members(12, 100), ","), strings.Join(members(10, 100), ",")},
	} {
		got, ok := events.TraceContext{Parent: goodParent, State: tt.state}.Clean()
		if !ok || got.Parent != goodParent || got.State != tt.want {
			t.Errorf("%s: Clean = %+v, %t; want traceparent kept and tracestate %q", name, got, ok, tt.want)
		}
		if len(got.State) > events.MaxTraceStateBytes {
			t.Errorf("%s: tracestate of %d bytes, over %d", name, len(got.State), events.MaxTraceStateBytes)
		}
	}
	if got, ok := (events.TraceContext{Parent: "00-xyz", State: goodState}).Clean(); ok || got != (events.TraceContext{}) {
		t.Errorf("bad traceparent: Clean = %+v, %t; want none", got, ok)
	}
}

// w3cCases are the headers of the W3C trace-context test suite
// (test/test.py in github.com/w3c/trace-context) with the outcome it
// expects: whether the traceparent is taken, and which tracestate list
// members survive ("" when the tracestate is dropped). Several tracestate
// headers are joined with commas, as the suite's RFC 9110 asks. The
// suite's strict-level-2 key cases (keys with @ anywhere, from the
// Level 2 draft's grammar) are left out: Level 1's multi-tenant key is
// the one followed.
var w3cCases = map[string]struct {
	parent, state string
	valid         bool
	wantState     string
}{
	"traceparent_included_tracestate_missing":    {"00-12345678901234567890123456789012-1234567890123456-01", "", true, ""},
	"version_0x00 trailing dot":                  {"00-12345678901234567890123456789012-1234567890123456-01.", "", false, ""},
	"version_0x00 future fields":                 {"00-12345678901234567890123456789012-1234567890123456-01-what-the-future-will-be-like", "", false, ""},
	"version_0xcc":                               {"cc-12345678901234567890123456789012-1234567890123456-01", "", true, ""},
	"version_0xcc future fields":                 {"cc-12345678901234567890123456789012-1234567890123456-01-what-the-future-will-be-like", "", true, ""},
	"version_0xcc bad separator":                 {"cc-12345678901234567890123456789012-1234567890123456-01.what-the-future-will-be-like", "", false, ""},
	"version_0xff":                               {"ff-12345678901234567890123456789012-1234567890123456-01", "", false, ""},
	"version_illegal_characters 1":               {".0-12345678901234567890123456789012-1234567890123456-01", "", false, ""},
	"version_illegal_characters 2":               {"0.-12345678901234567890123456789012-1234567890123456-01", "", false, ""},
	"version_too_long 1":                         {"000-12345678901234567890123456789012-1234567890123456-01", "", false, ""},
	"version_too_long 2":                         {"0000-12345678901234567890123456789012-1234567890123456-01", "", false, ""},
	"version_too_short":                          {"0-12345678901234567890123456789012-1234567890123456-01", "", false, ""},
	"trace_id_all_zero":                          {"00-00000000000000000000000000000000-1234567890123456-01", "", false, ""},
	"trace_id_illegal_characters 1":              {"00-.2345678901234567890123456789012-1234567890123456-01", "", false, ""},
	"trace_id_illegal_characters 2":              {"00-1234567890123456789012345678901.-1234567890123456-01", "", false, ""},
	"trace_id_too_long":                          {"00-123456789012345678901234567890123-1234567890123456-01", "", false, ""},
	"trace_id_too_short":                         {"00-1234567890123456789012345678901-1234567890123456-01", "", false, ""},
	"parent_id_all_zero":                         {"00-12345678901234567890123456789012-0000000000000000-01", "", false, ""},
	"parent_id_illegal_characters 1":             {"00-12345678901234567890123456789012-.234567890123456-01", "", false, ""},
	"parent_id_illegal_characters 2":             {"00-12345678901234567890123456789012-123456789012345.-01", "", false, ""},
	"parent_id_too_long":                         {"00-12345678901234567890123456789012-12345678901234567-01", "", false, ""},
	"parent_id_too_short":                        {"00-12345678901234567890123456789012-123456789012345-01", "", false, ""},
	"trace_flags_illegal_characters 1":           {"00-12345678901234567890123456789012-1234567890123456-.0", "", false, ""},
	"trace_flags_illegal_characters 2":           {"00-12345678901234567890123456789012-1234567890123456-0.", "", false, ""},
	"trace_flags_too_long":                       {"00-12345678901234567890123456789012-1234567890123456-001", "", false, ""},
	"trace_flags_too_short":                      {"00-12345678901234567890123456789012-1234567890123456-1", "", false, ""},
	"tracestate_included_traceparent_included":   {"00-12345678901234567890123456789012-1234567890123456-00", "foo=1,bar=2", true, "foo=1,bar=2"},
	"tracestate_empty_header":                    {"00-12345678901234567890123456789012-1234567890123456-00", "", true, ""},
	"tracestate_empty_header then foo":           {"00-12345678901234567890123456789012-1234567890123456-00", "foo=1,", true, "foo=1"},
	"tracestate_empty_header after foo":          {"00-12345678901234567890123456789012-1234567890123456-00", ",foo=1", true, "foo=1"},
	"tracestate_multiple_headers_different_keys": {"00-12345678901234567890123456789012-1234567890123456-00", "foo=1,bar=2,rojo=1,congo=2,baz=3", true, "foo=1,bar=2,rojo=1,congo=2,baz=3"},
	"tracestate_duplicated_keys 1":               {"00-12345678901234567890123456789012-1234567890123456-00", "foo=1,foo=1", true, ""},
	"tracestate_duplicated_keys 2":               {"00-12345678901234567890123456789012-1234567890123456-00", "foo=1,foo=2", true, ""},
	"tracestate_all_allowed_characters":          {"00-12345678901234567890123456789012-1234567890123456-00", w3cAllowedKey + "=" + w3cAllowedValue, true, w3cAllowedKey + "=" + w3cAllowedValue},
	"tracestate_all_allowed_characters vendor":   {"00-12345678901234567890123456789012-1234567890123456-00", w3cAllowedKey + "@a-z0-9_-*/=" + w3cAllowedValue, true, w3cAllowedKey + "@a-z0-9_-*/=" + w3cAllowedValue},
	"tracestate_ows_handling 1":                  {"00-12345678901234567890123456789012-1234567890123456-00", "foo=1 \t , \t bar=2, \t baz=3", true, "foo=1,bar=2,baz=3"},
	"tracestate_ows_handling 2":                  {"00-12345678901234567890123456789012-1234567890123456-00", "foo=1\t \t,\t \tbar=2,\t \tbaz=3", true, "foo=1,bar=2,baz=3"},
	"tracestate_ows_handling 3":                  {"00-12345678901234567890123456789012-1234567890123456-00", " foo=1", true, "foo=1"},
	"tracestate_ows_handling 4":                  {"00-12345678901234567890123456789012-1234567890123456-00", "\tfoo=1", true, "foo=1"},
	"tracestate_ows_handling 5":                  {"00-12345678901234567890123456789012-1234567890123456-00", "foo=1 ", true, "foo=1"},
	"tracestate_ows_handling 6":                  {"00-12345678901234567890123456789012-1234567890123456-00", "foo=1\t", true, "foo=1"},
	"tracestate_ows_handling 7":                  {"00-12345678901234567890123456789012-1234567890123456-00", "\t foo=1 \t", true, "foo=1"},
	"tracestate_key_illegal_characters 1":        {"00-12345678901234567890123456789012-1234567890123456-00", "foo =1", true, ""},
	"tracestate_key_illegal_characters 2":        {"00-12345678901234567890123456789012-1234567890123456-00", "FOO=1", true, ""},
	"tracestate_key_illegal_characters 3":        {"00-12345678901234567890123456789012-1234567890123456-00", "foo.bar=1", true, ""},
	"tracestate_member_count_limit 32":           {"00-12345678901234567890123456789012-1234567890123456-00", w3cMembers(32), true, w3cMembers(32)},
	"tracestate_member_count_limit 33":           {"00-12345678901234567890123456789012-1234567890123456-00", w3cMembers(33), true, ""},
	"tracestate_key_length_limit 256":            {"00-12345678901234567890123456789012-1234567890123456-00", "foo=1," + strings.Repeat("z", 256) + "=1", true, "foo=1," + strings.Repeat("z", 256) + "=1"},
	"tracestate_key_length_limit 257":            {"00-12345678901234567890123456789012-1234567890123456-00", "foo=1," + strings.Repeat("z", 257) + "=1", true, ""},
	"tracestate_key_length_limit 241@14":         {"00-12345678901234567890123456789012-1234567890123456-00", "foo=1," + strings.Repeat("t", 241) + "@" + strings.Repeat("v", 14) + "=1", true, "foo=1," + strings.Repeat("t", 241) + "@" + strings.Repeat("v", 14) + "=1"},
	"tracestate_key_length_limit 242@1":          {"00-12345678901234567890123456789012-1234567890123456-00", "foo=1," + strings.Repeat("t", 242) + "@v=1", true, ""},
	"tracestate_key_length_limit 1@15":           {"00-12345678901234567890123456789012-1234567890123456-00", "foo=1,t@" + strings.Repeat("v", 15) + "=1", true, ""},
	"tracestate_value_illegal_characters 1":      {"00-12345678901234567890123456789012-1234567890123456-00", "foo=bar=baz", true, ""},
	"tracestate_value_illegal_characters 2":      {"00-12345678901234567890123456789012-1234567890123456-00", "foo=,bar=3", true, ""},
}

// The suite's all-allowed-characters key and value.
const (
	w3cAllowedKey   = "abcdefghijklmnopqrstuvwxyz0123456789_-*/"
	w3cAllowedValue = " !\"#$%&'()*+-./0123456789:;<>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~"
)

// w3cMembers is the suite's list of n members barNN=NN.
func w3cMembers(n int) string {
	m := make([]string, n)
	for i := range m {
		m[i] = fmt.Sprintf("bar%02d=%02d", i+1, i+1)
	}
	return strings.Join(m, ",")
}

// TestTraceContextAgreesWithOpenTelemetry: on the W3C test suite's cases,
// Clean takes what the suite expects, and so does OpenTelemetry's W3C
// propagator, the one the relay, the inbox and most consumers parse with.
func TestTraceContextAgreesWithOpenTelemetry(t *testing.T) {
	t.Parallel()
	for name, tt := range w3cCases {
		got, ok := events.TraceContext{Parent: tt.parent, State: tt.state}.Clean()
		if ok != tt.valid || got.State != tt.wantState {
			t.Errorf("%s: Clean = %q, %t; the suite expects %t and tracestate %q", name, got.State, ok, tt.valid, tt.wantState)
		}
		carrier := propagation.MapCarrier{"traceparent": tt.parent, "tracestate": tt.state}
		sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), carrier))
		if sc.IsValid() != ok || sc.TraceState().String() != got.State {
			t.Errorf("%s: OpenTelemetry takes %t with tracestate %q; Clean %t with %q", name, sc.IsValid(), sc.TraceState().String(), ok, got.State)
		}
	}
}

// TestTraceContextFrom reads the span context of a context as W3C values;
// a context without one gives none.
func TestTraceContextFrom(t *testing.T) {
	t.Parallel()
	ts, err := trace.ParseTraceState(goodState)
	if err != nil {
		t.Fatal(err)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    [16]byte{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     [8]byte{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled, TraceState: ts,
	})
	got := events.TraceContextFrom(trace.ContextWithSpanContext(context.Background(), sc))
	if got.Parent != goodParent || got.State != goodState {
		t.Errorf("TraceContextFrom = %+v, want %s and %s", got, goodParent, goodState)
	}
	if got := events.TraceContextFrom(context.Background()); got != (events.TraceContext{}) {
		t.Errorf("TraceContextFrom(no span) = %+v, want none", got)
	}
}

// TestDraftStoresTheTraceContext: a valid trace context becomes the
// document's traceparent and tracestate; one that is not valid is left
// out, and the draft is still written.
func TestDraftStoresTheTraceContext(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		tc                events.TraceContext
		wantParent, state string
	}{
		{events.TraceContext{Parent: goodParent, State: goodState}, goodParent, goodState},
		{events.TraceContext{Parent: goodParent}, goodParent, ""},
		{events.TraceContext{Parent: "garbage", State: goodState}, "", ""},
	} {
		doc, err := events.Draft{Type: "t", Payload: bson.D{{Key: "n", Value: 1}}, Trace: tt.tc}.Document(traceNow)
		if err != nil {
			t.Fatalf("Document(%+v): %v", tt.tc, err)
		}
		raw, _ := bson.Marshal(doc)
		parent, _ := bson.Raw(raw).Lookup(events.FieldTraceParent).StringValueOK()
		state, _ := bson.Raw(raw).Lookup(events.FieldTraceState).StringValueOK()
		if parent != tt.wantParent || state != tt.state {
			t.Errorf("Document(%+v) stored traceparent %q, tracestate %q; want %q, %q", tt.tc, parent, state, tt.wantParent, tt.state)
		}
	}
}

// TestMessageCarriesTheTraceContext: the stored trace context becomes the
// message's traceparent and tracestate headers, over the event's own
// headers of those names, which never mix with it; without a stored one,
// the event's own headers are checked alike. One that is not valid, or
// not strings, is dropped and said so, and the message goes out without
// it; a bad tracestate goes alone.
func TestMessageCarriesTheTraceContext(t *testing.T) {
	t.Parallel()
	doc := func(headers bson.D, extra ...bson.E) bson.Raw {
		d := append(bson.D{
			{Key: "_id", Value: "e1"}, {Key: "type", Value: "t"}, {Key: "payload", Value: bson.D{}},
			{Key: "createdAt", Value: traceNow}, {Key: "headers", Value: headers},
		}, extra...)
		b, err := bson.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	const otherParent = "00-11111111111111111111111111111111-2222222222222222-01"
	ownPair := bson.D{{Key: "traceparent", Value: otherParent}, {Key: "tracestate", Value: "own=1"}}
	stored := func(parent any, state ...any) []bson.E {
		e := []bson.E{{Key: "traceparent", Value: parent}}
		for _, s := range state {
			e = append(e, bson.E{Key: "tracestate", Value: s})
		}
		return e
	}
	for name, tt := range map[string]struct {
		doc                   bson.Raw
		wantParent, wantState any
		wantDropped           bool
	}{
		"stored, over the headers' pair":                  {doc(ownPair, stored(goodParent, goodState)...), goodParent, goodState, false},
		"stored without tracestate: none of the headers'": {doc(ownPair, stored(goodParent)...), goodParent, nil, false},
		"stored, a bad tracestate alone goes":             {doc(ownPair, stored(goodParent, "Bad Key=1")...), goodParent, nil, true},
		"stored malformed: none, not the headers'":        {doc(ownPair, stored("00-xyz")...), nil, nil, true},
		"stored not a string":                             {doc(ownPair, stored(42)...), nil, nil, true},
		"stored tracestate not a string":                  {doc(ownPair, stored(goodParent, bson.A{})...), nil, nil, true},
		"stored tracestate alone":                         {doc(ownPair, bson.E{Key: "tracestate", Value: goodState}), nil, nil, true},
		"none stored: the headers' valid pair":            {doc(ownPair), otherParent, "own=1", false},
		"none stored: a malformed header":                 {doc(bson.D{{Key: "traceparent", Value: "from-the-event-headers"}}), nil, nil, true},
		"none stored: a header of another type":           {doc(bson.D{{Key: "traceparent", Value: int32(1)}}), nil, nil, true},
		"none stored: a bad header tracestate":            {doc(bson.D{{Key: "traceparent", Value: otherParent}, {Key: "tracestate", Value: "a=1,a=2"}}), otherParent, nil, true},
		"none stored: a header tracestate alone":          {doc(bson.D{{Key: "tracestate", Value: "a=1"}}), nil, nil, true},
		"none at all":                                     {doc(bson.D{{Key: "tenant", Value: "acme"}}), nil, nil, false},
	} {
		m, err := events.NewMessage(tt.doc, 0)
		if err != nil {
			t.Fatalf("%s: NewMessage: %v", name, err)
		}
		if m.Headers["traceparent"] != tt.wantParent || m.Headers["tracestate"] != tt.wantState || m.TraceDropped != tt.wantDropped {
			t.Errorf("%s: headers traceparent %v, tracestate %v, dropped %t; want %v, %v, %t", name,
				m.Headers["traceparent"], m.Headers["tracestate"], m.TraceDropped, tt.wantParent, tt.wantState, tt.wantDropped)
		}
	}
}
