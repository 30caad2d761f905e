package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"
)

const (
	testSource      = "/outbox/outbox/events"
	testTraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	testTraceState  = "rojo=00f067aa0ba902b7"
)

var (
	binaryFormat     = Format{Name: FormatCloudEventsBinary, Source: testSource}
	structuredFormat = Format{Name: FormatCloudEventsStructured, Source: testSource}
)

// ceHeaders are the attribute headers of eventDoc's message in binary
// mode with prefix, with more added: a key "$name" is the attribute
// header prefix+name, any other key a header as it is.
func ceHeaders(prefix string, more map[string]any) map[string]any {
	h := map[string]any{
		prefix + "specversion": "1.0",
		prefix + "id":          testObjectID.Hex(),
		prefix + "source":      testSource,
		prefix + "type":        "order.created",
		prefix + "time":        "2024-03-05T09:20:30.123Z",
	}
	for k, v := range more {
		if attr, ok := strings.CutPrefix(k, "$"); ok {
			k = prefix + attr
		}
		h[k] = v
	}
	return h
}

var prefixes = []string{PrefixAMQP, PrefixAMQPColon, PrefixKnative}

func TestFormatBinary(t *testing.T) {
	t.Parallel()
	hugeSubject := strings.Repeat("a", 100<<10)
	tests := []struct {
		name        string
		edits       []docEdit
		wantHeaders map[string]any
		wantDropped bool
	}{
		{
			name: "no aggregate: no subject",
		},
		{
			name:        "aggregate id is the subject",
			edits:       []docEdit{set(FieldAggregateType, "order"), set(FieldAggregateID, "o-1")},
			wantHeaders: map[string]any{"$subject": "o-1", HeaderAggregateType: "order", HeaderAggregateID: "o-1"},
		},
		{
			name:  "empty aggregate id: no subject",
			edits: []docEdit{set(FieldAggregateID, "")},
		},
		{
			name:  "null aggregate id: no subject",
			edits: []docEdit{set(FieldAggregateID, nil)},
		},
		{
			name:        "string _id is the id",
			edits:       []docEdit{set(FieldID, "order-42-created")},
			wantHeaders: map[string]any{"$id": "order-42-created"},
		},
		{
			name:        "non-ASCII, spaces and percent signs as they are, not percent-encoded",
			edits:       []docEdit{set(FieldType, "注文.作成.ü 100%"), set(FieldAggregateID, "kunde-ß-🙂 %41")},
			wantHeaders: map[string]any{"$type": "注文.作成.ü 100%", "$subject": "kunde-ß-🙂 %41", HeaderAggregateID: "kunde-ß-🙂 %41"},
		},
		{
			name:        "huge subject",
			edits:       []docEdit{set(FieldAggregateID, hugeSubject)},
			wantHeaders: map[string]any{"$subject": hugeSubject, HeaderAggregateID: hugeSubject},
		},
		{
			name:        "createdAt on a whole second",
			edits:       []docEdit{set(FieldCreatedAt, bson.NewDateTimeFromTime(time.Date(2024, 3, 5, 9, 20, 30, 0, time.UTC)))},
			wantHeaders: map[string]any{"$time": "2024-03-05T09:20:30Z"},
		},
		{
			name:  "stored trace context: the traceparent headers and the tracing extension",
			edits: []docEdit{set(FieldTraceParent, testTraceParent), set(FieldTraceState, testTraceState)},
			wantHeaders: map[string]any{
				FieldTraceParent: testTraceParent, FieldTraceState: testTraceState,
				"$traceparent": testTraceParent, "$tracestate": testTraceState,
			},
		},
		{
			name:        "a bad stored trace context is dropped from both",
			edits:       []docEdit{set(FieldTraceParent, "00-nonsense")},
			wantDropped: true,
		},
		{
			name:  "an event's own valid traceparent header is the tracing extension too",
			edits: []docEdit{set(FieldHeaders, bson.D{{Key: FieldTraceParent, Value: testTraceParent}})},
			wantHeaders: map[string]any{
				FieldTraceParent: testTraceParent, "$traceparent": testTraceParent,
			},
		},
	}
	for _, prefix := range prefixes {
		for _, tt := range tests {
			t.Run(prefix+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				f := Format{Name: FormatCloudEventsBinary, Source: testSource, Prefix: prefix}
				got, err := f.NewMessage(eventDoc(t, tt.edits...), 0)
				if err != nil {
					t.Fatalf("NewMessage: %v", err)
				}
				plain, err := NewMessage(eventDoc(t, tt.edits...), 0)
				if err != nil {
					t.Fatalf("plain NewMessage: %v", err)
				}
				// Only the headers differ from plain.
				got.Headers = withoutAMQP10(t, prefix, got.Headers)
				want := plain
				want.Headers = ceHeaders(prefix, tt.wantHeaders)
				want.TraceDropped = tt.wantDropped
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("message (-want +got):\n%s", diff)
				}
			})
		}
	}
}

// The default prefix is the AMQP binding's cloudEvents_.
func TestFormatBinaryDefaultPrefix(t *testing.T) {
	t.Parallel()
	m, err := binaryFormat.NewMessage(eventDoc(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(ceHeaders("cloudEvents_", nil), withoutAMQP10(t, PrefixAMQP, m.Headers)); diff != "" {
		t.Errorf("headers (-want +got):\n%s", diff)
	}
}

func TestFormatStructured(t *testing.T) {
	t.Parallel()
	const head = `{"specversion":"1.0","id":"65a1b2c3d4e5f60718293a4b","source":"/outbox/outbox/events","type":"order.created",` +
		`"time":"2024-03-05T09:20:30.123Z"`
	tests := []struct {
		name     string
		edits    []docEdit
		wantBody string
	}{
		{
			name:     "no aggregate: no subject",
			wantBody: head + `,"datacontenttype":"application/json","data":{"n":1}}`,
		},
		{
			name:     "aggregate id is the subject",
			edits:    []docEdit{set(FieldAggregateType, "order"), set(FieldAggregateID, "o-1")},
			wantBody: head + `,"subject":"o-1","datacontenttype":"application/json","data":{"n":1}}`,
		},
		{
			name:  "stored trace context is the tracing extension",
			edits: []docEdit{set(FieldTraceParent, testTraceParent), set(FieldTraceState, testTraceState)},
			wantBody: head + `,"datacontenttype":"application/json","traceparent":"` + testTraceParent +
				`","tracestate":"` + testTraceState + `","data":{"n":1}}`,
		},
		{
			name:     "JSON escapes in attributes",
			edits:    []docEdit{set(FieldID, `id "1" \ <b>`), set(FieldAggregateID, "o\u2028-1")},
			wantBody: strings.Replace(head, "65a1b2c3d4e5f60718293a4b", `id \"1\" \\ <b>`, 1) + `,"subject":"o\u2028-1","datacontenttype":"application/json","data":{"n":1}}`,
		},
		{
			name:     "non-ASCII type",
			edits:    []docEdit{set(FieldType, "注文.作成")},
			wantBody: strings.Replace(head, "order.created", "注文.作成", 1) + `,"datacontenttype":"application/json","data":{"n":1}}`,
		},
		{
			name: "payload of types only the driver writes",
			edits: []docEdit{set(FieldPayload, bson.D{
				{Key: "price", Value: mustDecimal(t, "12.50")},
				{Key: "at", Value: bson.NewDateTimeFromTime(time.Date(2024, 1, 2, 3, 4, 5, 678000000, time.UTC))},
			})},
			wantBody: head + `,"datacontenttype":"application/json","data":{"price":{"$numberDecimal":"12.50"},"at":{"$date":"2024-01-02T03:04:05.678Z"}}}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := structuredFormat.NewMessage(eventDoc(t, tt.edits...), 0)
			if err != nil {
				t.Fatalf("NewMessage: %v", err)
			}
			plain, err := NewMessage(eventDoc(t, tt.edits...), 0)
			if err != nil {
				t.Fatalf("plain NewMessage: %v", err)
			}
			if diff := cmp.Diff(tt.wantBody, string(got.Body)); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
			// data is the plain body, byte for byte.
			var env struct{ Data json.RawMessage }
			if err := json.Unmarshal(got.Body, &env); err != nil {
				t.Fatalf("the envelope is not JSON: %v", err)
			}
			if diff := cmp.Diff(string(plain.Body), string(env.Data)); diff != "" {
				t.Errorf("data is not the plain body (-want +got):\n%s", diff)
			}
			// Everything but the body and the content type is as in plain.
			want := plain
			want.Body, want.ContentType = got.Body, ContentTypeCloudEvents
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("message (-want +got):\n%s", diff)
			}
		})
	}
}

func mustDecimal(t *testing.T, s string) bson.Decimal128 {
	t.Helper()
	d, err := bson.ParseDecimal128(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// The envelope counts against the bound, not only the payload.
func TestFormatStructuredBound(t *testing.T) {
	t.Parallel()
	doc := eventDoc(t)
	m, err := structuredFormat.NewMessage(doc, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := structuredFormat.NewMessage(doc, len(m.Body)); err != nil {
		t.Errorf("envelope exactly at the bound: %v", err)
	}
	_, err = structuredFormat.NewMessage(doc, len(m.Body)-1)
	var ie *InvalidError
	if !errors.As(err, &ie) {
		t.Fatalf("envelope one byte over the bound: %v, want an *InvalidError", err)
	}
	want := &InvalidError{Field: FieldPayload, Reason: fmt.Sprintf(
		"is 7 bytes as JSON, in a CloudEvents envelope of %d bytes; the broker takes at most %d", len(m.Body), len(m.Body)-1)}
	if diff := cmp.Diff(want, ie); diff != "" {
		t.Errorf("error (-want +got):\n%s", diff)
	}
	// The same bound lets the plain body through.
	if _, err := NewMessage(doc, len(m.Body)-1); err != nil {
		t.Errorf("plain body under the bound: %v", err)
	}
}

// Values a CloudEvent cannot hold make the event poison in both
// CloudEvents formats, naming the field; plain takes them as before.
func TestFormatRefusesWhatCloudEventsCannotHold(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		edits []docEdit
		want  *InvalidError
	}{
		{"control character in type", []docEdit{set(FieldType, "order\x01created")},
			&InvalidError{Field: FieldType, Reason: "holds the control character U+0001 at byte 5, which the CloudEvents attribute type must not hold"}},
		{"C1 control character in type", []docEdit{set(FieldType, "order\u0085created")},
			&InvalidError{Field: FieldType, Reason: "holds the control character U+0085 at byte 5, which the CloudEvents attribute type must not hold"}},
		{"newline in a string _id", []docEdit{set(FieldID, "id\n1")},
			&InvalidError{Field: FieldID, Reason: "holds the control character U+000A at byte 2, which the CloudEvents attribute id must not hold"}},
		{"invalid UTF-8 in aggregateId", []docEdit{set(FieldAggregateID, "o-\xff")},
			&InvalidError{Field: FieldAggregateID, Reason: "is not valid UTF-8 at byte 2; the CloudEvents attribute subject must be a Unicode string"}},
		{"noncharacter in aggregateId", []docEdit{set(FieldAggregateID, "o-\uFFFE")},
			&InvalidError{Field: FieldAggregateID, Reason: "holds the Unicode noncharacter U+FFFE at byte 2, which the CloudEvents attribute subject must not hold"}},
		{"noncharacter of another plane in type", []docEdit{set(FieldType, "a\U0010FFFF")},
			&InvalidError{Field: FieldType, Reason: "holds the Unicode noncharacter U+10FFFF at byte 1, which the CloudEvents attribute type must not hold"}},
		{"createdAt after 9999", []docEdit{set(FieldCreatedAt, bson.NewDateTimeFromTime(time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)))},
			&InvalidError{Field: FieldCreatedAt, Reason: "is in the year 10000; a CloudEvents time (RFC 3339) holds the years 0 to 9999"}},
	}
	for _, tt := range tests {
		for _, f := range []Format{binaryFormat, structuredFormat} {
			t.Run(tt.name+"/"+f.Name, func(t *testing.T) {
				t.Parallel()
				_, err := f.NewMessage(eventDoc(t, tt.edits...), 0)
				var ie *InvalidError
				if !errors.As(err, &ie) {
					t.Fatalf("NewMessage: %v, want an *InvalidError", err)
				}
				if diff := cmp.Diff(tt.want, ie); diff != "" {
					t.Errorf("error (-want +got):\n%s", diff)
				}
				if _, err := NewMessage(eventDoc(t, tt.edits...), 0); err != nil {
					t.Errorf("plain NewMessage: %v, want it to take the event", err)
				}
			})
		}
	}
	// A U+FFFD written as such is a character, not invalid UTF-8.
	if _, err := binaryFormat.NewMessage(eventDoc(t, set(FieldAggregateID, "o-\uFFFD")), 0); err != nil {
		t.Errorf("U+FFFD in aggregateId: %v", err)
	}
}

// The contract's checks come first, whatever the format.
func TestFormatKeepsTheContractChecks(t *testing.T) {
	t.Parallel()
	for _, f := range []Format{{}, binaryFormat, structuredFormat} {
		_, err := f.NewMessage(eventDoc(t, unset(FieldPayload)), 0)
		var ie *InvalidError
		if !errors.As(err, &ie) || ie.Field != FieldPayload {
			t.Errorf("%q: no payload: %v, want an *InvalidError for payload", f.Name, err)
		}
		_, err = f.NewMessage(eventDoc(t, set(FieldType, 7)), 0)
		if !errors.As(err, &ie) || ie.Field != FieldType {
			t.Errorf("%q: number type: %v, want an *InvalidError for type", f.Name, err)
		}
	}
}

func TestFormatPlainIsNewMessage(t *testing.T) {
	t.Parallel()
	doc := eventDoc(t, set(FieldAggregateID, "o-1"), set(FieldTraceParent, testTraceParent),
		set(FieldHeaders, bson.D{{Key: "ce-id", Value: "kept in plain"}}))
	want, err := NewMessage(doc, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []Format{{}, {Name: FormatPlain}, {Name: FormatPlain, Source: "ignored"}} {
		got, err := f.NewMessage(doc, 0)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%+v (-want +got):\n%s", f, diff)
		}
	}
	if want.Headers["ce-id"] != "kept in plain" || want.ContentType != ContentType {
		t.Errorf("plain message: headers %v, content type %q", want.Headers, want.ContentType)
	}
}

func TestFormatValidate(t *testing.T) {
	t.Parallel()
	valid := []Format{
		{},
		{Name: FormatPlain},
		{Name: FormatCloudEventsBinary, Source: "/outbox/outbox/events"},
		{Name: FormatCloudEventsStructured, Source: "https://example.com/orders?x=1#f"},
		{Name: FormatCloudEventsBinary, Source: "urn:uuid:6e8bc430-9c3a-11d9-9669-0800200c9a66"},
		{Name: FormatCloudEventsBinary, Source: "/outbox/my%20db/events"},
		{Name: FormatCloudEventsBinary, Source: "orders"},
		{Name: FormatCloudEventsBinary, Source: "orders", Prefix: PrefixAMQP},
		{Name: FormatCloudEventsBinary, Source: "orders", Prefix: PrefixAMQPColon},
		{Name: FormatCloudEventsBinary, Source: "orders", Prefix: PrefixKnative},
	}
	for _, f := range valid {
		if err := f.Validate(); err != nil {
			t.Errorf("%+v: %v", f, err)
		}
	}
	invalid := map[string]Format{
		`name "cloudevents": want plain, cloudevents-binary or cloudevents-structured`: {Name: "cloudevents"},
		`source "": must not be empty`: {Name: FormatCloudEventsBinary},
		`source "/a b": has ' ' at byte 2, which a URI-reference must escape (RFC 3986)`:                                 {Name: FormatCloudEventsStructured, Source: "/a b"},
		`source "/ü": has the byte 0xc3 at byte 1; a URI-reference is printable ASCII, anything else escaped (RFC 3986)`: {Name: FormatCloudEventsBinary, Source: "/ü"},
		`source "/a%2": has a % at byte 2 that does not start an escape such as %20`:                                     {Name: FormatCloudEventsBinary, Source: "/a%2"},
		`source "/a%zz": has a % at byte 2 that does not start an escape such as %20`:                                    {Name: FormatCloudEventsBinary, Source: "/a%zz"},
		`source "http://[::1": is not a URI-reference (RFC 3986)`:                                                        {Name: FormatCloudEventsBinary, Source: "http://[::1"},
		`prefix "ce_": want cloudEvents_, cloudEvents: or ce-`:                                                           {Name: FormatCloudEventsBinary, Source: "/a", Prefix: "ce_"},
	}
	for want, f := range invalid {
		err := f.Validate()
		if !errors.Is(err, ErrInvalidFormat) || !strings.HasSuffix(err.Error(), want) {
			t.Errorf("%+v: %v, want ErrInvalidFormat ending %q", f, err, want)
		}
	}
}

// TestDefaultCloudEventsSourceIsValid: whatever the database is called,
// the default source passes the check a configured source must pass.
// (ExampleDefaultCloudEventsSource shows the values.)
func TestDefaultCloudEventsSourceIsValid(t *testing.T) {
	t.Parallel()
	for _, db := range []string{"outbox", "my db", "ürün/x?y", "%", "a\x00b"} {
		got := DefaultCloudEventsSource(db, "events")
		if err := CheckCloudEventsSource(got); err != nil {
			t.Errorf("DefaultCloudEventsSource(%q) = %q: %v", db, got, err)
		}
	}
}

// FuzzFormatNewMessage checks the CloudEvents formats against plain on
// any document: the contract's checks fail the same way first, and a
// message made has a body plain would have made, or one wrapping it.
func FuzzFormatNewMessage(f *testing.F) {
	for _, seed := range fuzzSeeds(f) {
		f.Add(seed)
	}
	for _, doc := range []bson.Raw{
		eventDoc(f, set(FieldAggregateID, "o-\x01"), set(FieldTraceParent, testTraceParent)),
		eventDoc(f, set(FieldType, "a\uFFFF"), set(FieldHeaders, bson.D{{Key: "CloudEvents_ID", Value: "x"}, {Key: "cloudEvents_a_b", Value: "x"}})),
		eventDoc(f, set(FieldPayload, bson.D{{Key: "s", Value: strings.Repeat("x", fuzzMaxBody-20)}})),
	} {
		f.Add([]byte(doc))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		orig := bytes.Clone(data)
		plain, plainErr := NewMessage(bson.Raw(data), fuzzMaxBody)
		for _, format := range []Format{binaryFormat, structuredFormat} {
			m, err := format.NewMessage(bson.Raw(data), fuzzMaxBody)
			if !bytes.Equal(orig, data) {
				t.Fatal("NewMessage modified its input")
			}
			var ie, plainIE *InvalidError
			switch {
			case err != nil && !errors.As(err, &ie):
				t.Fatalf("%s: error %v (%T) is not an *InvalidError", format.Name, err, err)
			case err != nil:
				if ie.Field == "" {
					t.Fatalf("%s: error %v names no field", format.Name, err)
				}
				// What plain refuses for another field than the payload,
				// every format refuses for the same reason.
				if errors.As(plainErr, &plainIE) && plainIE.Field != FieldPayload && err.Error() != plainErr.Error() {
					t.Fatalf("%s: error %v, plain's %v", format.Name, err, plainErr)
				}
				continue
			case plainErr != nil:
				t.Fatalf("%s: took a document plain refuses: %v", format.Name, plainErr)
			}
			if len(m.Body) > fuzzMaxBody {
				t.Errorf("%s: body of %d bytes, over the bound of %d", format.Name, len(m.Body), fuzzMaxBody)
			}
			for _, attr := range []string{PrefixAMQP + "id", PrefixAMQP + "type", PrefixAMQP + "subject"} {
				if s, ok := m.Headers[attr].(string); ok {
					if err := checkCloudEventsString(attr, attr, s); err != nil {
						t.Errorf("%s: %v", format.Name, err)
					}
				}
			}
			if format.Name == FormatCloudEventsBinary {
				if !bytes.Equal(m.Body, plain.Body) || m.Headers[PrefixAMQP+"id"] != plain.ID || m.Headers[PrefixAMQP+"type"] != plain.Type {
					t.Errorf("binary: body %q, id %v, type %v; plain: %q, %s, %s",
						m.Body, m.Headers[PrefixAMQP+"id"], m.Headers[PrefixAMQP+"type"], plain.Body, plain.ID, plain.Type)
				}
				continue
			}
			var env struct {
				ID   string          `json:"id"`
				Type string          `json:"type"`
				Data json.RawMessage `json:"data"`
			}
			if err := json.Unmarshal(m.Body, &env); err != nil {
				t.Fatalf("structured: the envelope is not JSON: %v: %q", err, m.Body)
			}
			if !bytes.Equal(env.Data, plain.Body) || env.ID != plain.ID || env.Type != plain.Type {
				t.Errorf("structured: id %q, type %q, data %q; plain: %q, %q, %q", env.ID, env.Type, env.Data, plain.ID, plain.Type, plain.Body)
			}
		}
	})
}
