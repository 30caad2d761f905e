package events

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"strings"
	"testing"
	"time"

	goamqp "github.com/Azure/go-amqp"
	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// withoutAMQP10 checks and removes the HeaderAMQP10AppProperties of
// headers: with an AMQP prefix it must decode, by go-amqp's own decoder,
// to the headers named with the prefix; with Knative's it must be absent.
func withoutAMQP10(t *testing.T, prefix string, headers map[string]any) map[string]any {
	t.Helper()
	section, ok := headers[HeaderAMQP10AppProperties].([]byte)
	if prefix == PrefixKnative {
		if ok {
			t.Errorf("prefix %s: a %s header", prefix, HeaderAMQP10AppProperties)
		}
		return headers
	}
	if !ok {
		t.Fatalf("prefix %s: no %s header among %v", prefix, HeaderAMQP10AppProperties, headers)
	}
	var m goamqp.Message
	if err := m.UnmarshalBinary(section); err != nil {
		t.Fatalf("prefix %s: go-amqp cannot read the section: %v", prefix, err)
	}
	want := map[string]any{}
	for k, v := range headers {
		if strings.HasPrefix(k, prefix) {
			if i, ok := v.(int32); ok {
				v = int64(i) // an Integer is an AMQP long
			}
			want[k] = v
		}
	}
	if diff := cmp.Diff(want, m.ApplicationProperties); diff != "" {
		t.Errorf("prefix %s: application-properties (-headers +decoded):\n%s", prefix, diff)
	}
	rest := maps.Clone(headers)
	delete(rest, HeaderAMQP10AppProperties)
	return rest
}

// badName is the error of a header that readers of prefix take for the
// extension name, which CloudEvents does not allow: the reason is the
// same under every prefix, so the cases below give only what differs.
func badName(header, name, prefix string) *InvalidError {
	return &InvalidError{Field: "headers." + header, Reason: fmt.Sprintf("is read as the CloudEvents extension %q (prefix %q), but CloudEvents names are lower-case letters and digits only, and readers reject the whole event; rename the header, or use another prefix", name, prefix)}
}

// badPrefix is the error of a header that AMQP readers take for the
// extension name, though it spells their prefix otherwise.
func badPrefix(header, name string) *InvalidError {
	return &InvalidError{Field: "headers." + header, Reason: fmt.Sprintf(`is read as the CloudEvents extension %q, but spells the prefix otherwise than "cloudEvents_": the AMQP binding has a message name all its attributes with one prefix`, name)}
}

// An event header that the prefix's readers take for an attribute the
// relay owns never reaches the message; one they take for an extension
// is checked as they will read it; the others pass as they are.
func TestFormatBinaryEventHeaders(t *testing.T) {
	t.Parallel()
	type headerCase struct {
		name, prefix string
		headers      bson.D
		want         map[string]any // the headers besides ceHeaders' ones
		wantErr      *InvalidError
	}
	tests := []headerCase{
		{
			name: "owned attributes cannot be forged, in any case", prefix: PrefixAMQP,
			headers: bson.D{
				{Key: "cloudEvents_id", Value: "forged"}, {Key: "cloudEvents_Type", Value: "forged"},
				{Key: "CloudEvents_source", Value: "forged"}, {Key: "cloudEvents_specversion", Value: "0.3"},
				{Key: "cloudEvents_time", Value: "1999-01-01T00:00:00Z"}, {Key: "cloudEvents_subject", Value: "forged"},
				{Key: "cloudEvents_datacontenttype", Value: "text/plain"}, {Key: "cloudEvents_TraceParent", Value: testTraceParent},
				{Key: "cloudEvents_tracestate", Value: "forged=1"},
				{Key: "cloudEvents_dataschema", Value: "https://example.com/order.json"}, {Key: "cloudEvents_partitionkey", Value: "o-1"},
				{Key: "cloudEvents:type", Value: "forged with the other separator"},
				{Key: "tenant_id", Value: "acme"}, {Key: "ce-tenant_id", Value: "not read by AMQP readers"},
			},
			want: map[string]any{"cloudEvents_dataschema": "https://example.com/order.json", "cloudEvents_partitionkey": "o-1",
				"tenant_id": "acme", "ce-tenant_id": "not read by AMQP readers"},
		},
		{
			name: "extensions of the colon prefix, of CloudEvents' types", prefix: PrefixAMQPColon,
			headers: bson.D{
				{Key: "cloudEvents:tenant", Value: "acme"}, {Key: "cloudEvents:retries", Value: int32(3)},
				{Key: "cloudEvents:big", Value: int64(math.MaxInt32)}, {Key: "cloudEvents:ok", Value: true},
				{Key: "cloudEvents:blob", Value: bson.Binary{Data: []byte{1, 2}}}, {Key: "cloudEvents:due", Value: time.Date(2024, 1, 2, 3, 4, 5, 6e6, time.UTC)},
				{Key: "cloudEvents:id", Value: "forged"},
			},
			// Binary and Timestamp as their canonical strings (conformance_test.go).
			want: map[string]any{"cloudEvents:tenant": "acme", "cloudEvents:retries": int32(3), "cloudEvents:big": int64(math.MaxInt32), "cloudEvents:ok": true,
				"cloudEvents:blob": "AQI=", "cloudEvents:due": "2024-01-02T03:04:05.006Z"},
		},
		{
			name: "an extension of a type CloudEvents has not", prefix: PrefixAMQP,
			headers: bson.D{{Key: "cloudEvents_ratio", Value: 0.5}},
			wantErr: &InvalidError{Field: "headers.cloudEvents_ratio", Reason: "is a double, which the CloudEvents extension ratio cannot hold: its types are strings, booleans, 32-bit integers, binary and timestamps"},
		},
		{
			name: "an extension over 32 bits", prefix: PrefixAMQP,
			headers: bson.D{{Key: "cloudEvents_n", Value: int64(math.MaxInt32) + 1}},
			wantErr: &InvalidError{Field: "headers.cloudEvents_n", Reason: "is 2147483648, which the CloudEvents extension n cannot hold: a CloudEvents integer is 32 bits"},
		},
		{
			name: "an extension string with a control character", prefix: PrefixAMQP,
			headers: bson.D{{Key: "cloudEvents_note", Value: "a\x00b"}},
			wantErr: &InvalidError{Field: "headers.cloudEvents_note", Reason: "holds the control character U+0000 at byte 1, which the CloudEvents attribute note must not hold"},
		},
		{
			name: "two bad headers: the first by name is named", prefix: PrefixAMQP,
			headers: bson.D{{Key: "cloudEvents_z_z", Value: "1"}, {Key: "cloudEvents_a_a", Value: "1"}, {Key: "cloudEvents_m_m", Value: "1"}},
			wantErr: badName("cloudEvents_a_a", "a_a", "cloudEvents_"),
		},
		{
			name: "Knative reads every header but x- ones, lower-cased, without ce-", prefix: PrefixKnative,
			headers: bson.D{
				{Key: "Tenant", Value: "acme"}, {Key: "ce-Region", Value: "eu"}, {Key: "x-retry_count", Value: 1.5},
				{Key: "ratio", Value: 0.5}, {Key: "type", Value: "forged"}, {Key: "CE-ID", Value: "forged"},
				{Key: "Content-Type", Value: "text/plain"}, {Key: "ce-tracestate", Value: "forged=1"},
			},
			want: map[string]any{"Tenant": "acme", "ce-Region": "eu", "x-retry_count": 1.5, "ratio": 0.5},
		},
	}
	// An event whose one header the prefix's readers take for an
	// extension under a name CloudEvents does not allow: a row each, as
	// only the header and the name read differ.
	for _, m := range []struct {
		name, prefix, header string
		wantErr              *InvalidError
	}{
		{"an extension with the other separator", PrefixAMQP, "cloudEvents:region", badPrefix("cloudEvents:region", "region")},
		{"an extension with the prefix in another case", PrefixAMQP, "CloudEvents_region", badPrefix("CloudEvents_region", "region")},
		{"an extension name with an underscore", PrefixAMQP, "cloudEvents_tenant_id", badName("cloudEvents_tenant_id", "tenant_id", "cloudEvents_")},
		{"an upper-case extension name", PrefixAMQPColon, "cloudEvents:Tenant", badName("cloudEvents:Tenant", "Tenant", "cloudEvents:")},
		{"Knative: an extension name with an underscore", PrefixKnative, "tenant_id", badName("tenant_id", "tenant_id", "ce-")},
		{"Knative: the prefix alone", PrefixKnative, "ce-", badName("ce-", "", "ce-")},
	} {
		tests = append(tests, headerCase{name: m.name, prefix: m.prefix, headers: bson.D{{Key: m.header, Value: "acme"}}, wantErr: m.wantErr})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := Format{Name: FormatCloudEventsBinary, Source: testSource, Prefix: tt.prefix}
			doc := eventDoc(t, set(FieldHeaders, tt.headers))
			got, err := f.NewMessage(doc, 0)
			if tt.wantErr != nil {
				var ie *InvalidError
				if !errors.As(err, &ie) {
					t.Fatalf("NewMessage: %v, want an *InvalidError", err)
				}
				if diff := cmp.Diff(tt.wantErr, ie); diff != "" {
					t.Errorf("error (-want +got):\n%s", diff)
				}
				if _, err := NewMessage(doc, 0); err != nil {
					t.Errorf("plain NewMessage: %v, want it to take the event", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewMessage: %v", err)
			}
			if diff := cmp.Diff(ceHeaders(tt.prefix, tt.want), withoutAMQP10(t, tt.prefix, got.Headers)); diff != "" {
				t.Errorf("headers (-want +got):\n%s", diff)
			}
		})
	}
}
