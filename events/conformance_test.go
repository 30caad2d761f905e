package events

import (
	"errors"
	"strings"
	"testing"
	"time"

	goamqp "github.com/Azure/go-amqp"
	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// These tests read the message formats as a conforming CloudEvents
// reader does (CloudEvents 1.0.2, its AMQP binding and AMQP format).

// binaryMessage is the binary-mode message of an event with headers.
func binaryMessage(t *testing.T, prefix string, headers bson.D) (Message, error) {
	t.Helper()
	f := Format{Name: FormatCloudEventsBinary, Source: testSource, Prefix: prefix}
	return f.NewMessage(eventDoc(t, set(FieldHeaders, headers)), 0)
}

// appProperties decodes the message's AMQP 1.0 application-properties
// with go-amqp, as an AMQP 1.0 consumer of RabbitMQ 3.x gets them.
func appProperties(t *testing.T, m Message) map[string]any {
	t.Helper()
	section, ok := m.Headers[HeaderAMQP10AppProperties].([]byte)
	if !ok {
		t.Fatalf("no %s header among %v", HeaderAMQP10AppProperties, m.Headers)
	}
	var am goamqp.Message
	if err := am.UnmarshalBinary(section); err != nil {
		t.Fatalf("go-amqp cannot read the section: %v", err)
	}
	return am.ApplicationProperties
}

// The AMQP format maps a CloudEvents Integer to an AMQP long: a reader
// that takes the application-properties by type reads a 32-bit AMQP int
// as no CloudEvents type.
func TestAMQP10IntegerIsLong(t *testing.T) {
	t.Parallel()
	m, err := binaryMessage(t, PrefixAMQP, bson.D{{Key: "cloudEvents_retries", Value: int32(3)}, {Key: "cloudEvents_big", Value: int64(-7)}})
	if err != nil {
		t.Fatal(err)
	}
	props := appProperties(t, m)
	for name, want := range map[string]int64{"cloudEvents_retries": 3, "cloudEvents_big": -7} {
		if got, ok := props[name].(int64); !ok || got != want {
			t.Errorf("application-properties %s = %#v (%T), want the AMQP long %d", name, props[name], props[name], want)
		}
	}
}

// Over AMQP 0-9-1 a header holds a Binary as a byte array and a Timestamp
// in whole seconds, which no CloudEvents reader takes for its types: the
// message carries their canonical strings, Base64 and RFC 3339 (with the
// milliseconds), under every prefix.
func TestBinaryModeCanonicalStrings(t *testing.T) {
	t.Parallel()
	due := time.Date(2024, 1, 2, 3, 4, 5, 6e6, time.UTC)
	for _, prefix := range []string{PrefixAMQP, PrefixAMQPColon, PrefixKnative} {
		m, err := binaryMessage(t, prefix, bson.D{
			{Key: prefix + "blob", Value: bson.Binary{Data: []byte{0xfb, 0xff, 0x01}}},
			{Key: prefix + "due", Value: due},
		})
		if err != nil {
			t.Fatalf("prefix %s: %v", prefix, err)
		}
		want := map[string]any{prefix + "blob": "+/8B", prefix + "due": "2024-01-02T03:04:05.006Z"}
		for name, w := range want {
			if got := m.Headers[name]; got != w {
				t.Errorf("prefix %s: header %s = %#v (%T), want the canonical string %q", prefix, name, got, got, w)
			}
		}
		if prefix == PrefixKnative {
			continue
		}
		props := appProperties(t, m)
		for name, w := range want {
			if got := props[name]; got != w {
				t.Errorf("prefix %s: application-properties %s = %#v, want %q", prefix, name, got, w)
			}
		}
	}
}

// "data" is no extension name (CloudEvents reserves it for the event's
// data), and dataschema, a URI, must be an absolute URI like the other
// attributes of that type.
func TestBinaryModeReservedAndURIAttributes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, prefix, header string
		value                any
		wantReason           string // "" takes the event
	}{
		{"data under the AMQP prefix", PrefixAMQP, "cloudEvents_data", "x", `"data" is the event's data`},
		{"data under the colon prefix", PrefixAMQPColon, "cloudEvents:data", "x", `"data" is the event's data`},
		{"data for Knative", PrefixKnative, "ce-data", "x", `"data" is the event's data`},
		{"data for Knative, without ce-", PrefixKnative, "Data", "x", `"data" is the event's data`},
		{"a dataschema that is a URI", PrefixAMQP, "cloudEvents_dataschema", "https://example.com/schemas/order.json", ""},
		{"a relative dataschema", PrefixAMQP, "cloudEvents_dataschema", "schemas/order.json", "absolute URI"},
		{"a dataschema with a space", PrefixAMQP, "cloudEvents_dataschema", "https://example.com/a b", "absolute URI"},
		{"a dataschema that is no string", PrefixAMQP, "cloudEvents_dataschema", int32(1), "absolute URI"},
		{"a Knative dataschema that is no URI", PrefixKnative, "ce-dataschema", "order", "absolute URI"},
	} {
		m, err := binaryMessage(t, tc.prefix, bson.D{{Key: tc.header, Value: tc.value}})
		if tc.wantReason == "" {
			if err != nil {
				t.Errorf("%s: %v, want the event taken", tc.name, err)
			} else if m.Headers[tc.header] != tc.value {
				t.Errorf("%s: header %s = %#v, want %#v", tc.name, tc.header, m.Headers[tc.header], tc.value)
			}
			continue
		}
		var ie *InvalidError
		if !errors.As(err, &ie) || ie.Field != "headers."+tc.header || !strings.Contains(ie.Reason, tc.wantReason) {
			t.Errorf("%s: %v, want an *InvalidError on headers.%s saying %q", tc.name, err, tc.header, tc.wantReason)
		}
	}
}

// A reader of the binary mode takes these headers for the event's
// attributes whatever the content type says; in structured mode, as in
// binary mode, the relay's own attributes are not forged by them.
func TestStructuredModeDropsForgedAttributes(t *testing.T) {
	t.Parallel()
	doc := eventDoc(t, set(FieldHeaders, bson.D{
		{Key: "cloudEvents_type", Value: "forged"}, {Key: "cloudEvents:id", Value: "forged"},
		{Key: "CloudEvents_Source", Value: "forged"}, {Key: "ce-time", Value: "1999-01-01T00:00:00Z"},
		{Key: "ce-specversion", Value: "0.3"}, {Key: "cloudEvents_traceparent", Value: testTraceParent},
		{Key: "tenant", Value: "acme"}, {Key: "cloudEvents_region", Value: "eu"},
	}))
	m, err := structuredFormat.NewMessage(doc, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"tenant": "acme", "cloudEvents_region": "eu"}
	got := map[string]any{}
	for k, v := range m.Headers {
		if k != HeaderAggregateType && k != HeaderAggregateID && k != HeaderSequence && k != FieldTraceParent && k != FieldTraceState {
			got[k] = v
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("structured mode's headers (-want +got):\n%s", diff)
	}
}
