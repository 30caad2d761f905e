package events_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
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
		"tracestate too long":              {events.TraceContext{Parent: goodParent, State: strings.Repeat("a", 9000)}, false},
		"tracestate not ASCII":             {events.TraceContext{Parent: goodParent, State: "k=vé"}, false},
	} {
		if got := tt.tc.Valid(); got != tt.want {
			t.Errorf("%s: Valid(%+v) = %t, want %t", name, tt.tc, got, tt.want)
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
// message's traceparent and tracestate headers, over an event header of
// the same name; one that is not valid, or not strings, is dropped and
// said so, and the message goes out without it.
func TestMessageCarriesTheTraceContext(t *testing.T) {
	t.Parallel()
	base := func(extra ...bson.E) bson.Raw {
		d := append(bson.D{
			{Key: "_id", Value: "e1"}, {Key: "type", Value: "t"}, {Key: "payload", Value: bson.D{}},
			{Key: "createdAt", Value: traceNow}, {Key: "headers", Value: bson.D{{Key: "traceparent", Value: "from-the-event-headers"}}},
		}, extra...)
		b, err := bson.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tt := range []struct {
		name        string
		doc         bson.Raw
		wantParent  any
		wantState   any
		wantDropped bool
	}{
		{"valid", base(bson.E{Key: "traceparent", Value: goodParent}, bson.E{Key: "tracestate", Value: goodState}), goodParent, goodState, false},
		{"none", base(), "from-the-event-headers", nil, false},
		{"malformed", base(bson.E{Key: "traceparent", Value: "00-xyz"}), "from-the-event-headers", nil, true},
		{"not a string", base(bson.E{Key: "traceparent", Value: 42}), "from-the-event-headers", nil, true},
		{"tracestate not a string", base(bson.E{Key: "traceparent", Value: goodParent}, bson.E{Key: "tracestate", Value: bson.A{}}), "from-the-event-headers", nil, true},
	} {
		m, err := events.NewMessage(tt.doc, 0)
		if err != nil {
			t.Fatalf("%s: NewMessage: %v", tt.name, err)
		}
		if m.Headers["traceparent"] != tt.wantParent || m.Headers["tracestate"] != tt.wantState || m.TraceDropped != tt.wantDropped {
			t.Errorf("%s: headers traceparent %v, tracestate %v, dropped %t; want %v, %v, %t", tt.name,
				m.Headers["traceparent"], m.Headers["tracestate"], m.TraceDropped, tt.wantParent, tt.wantState, tt.wantDropped)
		}
	}
}
