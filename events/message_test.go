package events

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Fixtures shared by the NewMessage tests.
var (
	testObjectID = mustObjectID("65a1b2c3d4e5f60718293a4b")
	// testCreatedAt has sub-millisecond digits and a zone other than UTC;
	// BSON keeps milliseconds, and the message must carry UTC.
	testCreatedAt = time.Date(2024, 3, 5, 10, 20, 30, 123456789, time.FixedZone("CET", 3600))
	testTimestamp = time.Date(2024, 3, 5, 9, 20, 30, 123000000, time.UTC)
)

func mustObjectID(hex string) bson.ObjectID {
	id, err := bson.ObjectIDFromHex(hex)
	if err != nil {
		panic(err)
	}
	return id
}

// docEdit changes an event document before it is marshalled.
type docEdit func(bson.D) bson.D

// set replaces the value of key, or appends key if the document lacks it.
func set(key string, value any) docEdit {
	return func(d bson.D) bson.D {
		for i := range d {
			if d[i].Key == key {
				d[i].Value = value
				return d
			}
		}
		return append(d, bson.E{Key: key, Value: value})
	}
}

// unset removes key from the document.
func unset(key string) docEdit {
	return func(d bson.D) bson.D {
		out := d[:0]
		for _, e := range d {
			if e.Key != key {
				out = append(out, e)
			}
		}
		return out
	}
}

// eventDoc returns a valid NEW event document with edits applied, as the
// worker reads it from MongoDB.
func eventDoc(t testing.TB, edits ...docEdit) bson.Raw {
	t.Helper()
	d := bson.D{
		{Key: FieldID, Value: testObjectID},
		{Key: FieldType, Value: "order.created"},
		{Key: FieldPayload, Value: bson.D{{Key: "n", Value: int32(1)}}},
		{Key: FieldStatus, Value: StatusNew},
		{Key: FieldCreatedAt, Value: bson.NewDateTimeFromTime(testCreatedAt)},
	}
	for _, edit := range edits {
		d = edit(d)
	}
	return marshal(t, d)
}

// malformedString returns a valid event document with field (or, for
// "headers.<key>", that header) replaced by a string element whose length
// prefix is 0, which no encoder writes but a bit flip could.
func malformedString(t testing.TB, field string) bson.Raw {
	t.Helper()
	bad := func(key string) []byte {
		return append(bsoncore.AppendHeader(nil, bsoncore.TypeString, key), 0, 0, 0, 0)
	}
	header, isHeader := strings.CutPrefix(field, FieldHeaders+".")
	var elems [][]byte
	for _, e := range mustElements(t, eventDoc(t)) {
		if e.Key() != field {
			elems = append(elems, e)
		}
	}
	if isHeader {
		elems = append(elems, bsoncore.AppendDocumentElement(nil, FieldHeaders,
			bsoncore.BuildDocumentFromElements(nil, bad(header))))
	} else {
		elems = append(elems, bad(field))
	}
	doc := bson.Raw(bsoncore.BuildDocumentFromElements(nil, elems...))
	// The point of the fixture: the driver's own validation lets it through.
	if err := doc.Validate(); err != nil {
		t.Fatalf("malformed %s fixture fails Validate: %v", field, err)
	}
	return doc
}

func mustElements(t testing.TB, doc bson.Raw) []bson.RawElement {
	t.Helper()
	elems, err := doc.Elements()
	if err != nil {
		t.Fatal(err)
	}
	return elems
}

// baseMessage is the message eventDoc becomes without edits.
func baseMessage() Message {
	return Message{
		ID:          testObjectID.Hex(),
		Type:        "order.created",
		Timestamp:   testTimestamp,
		Body:        []byte(`{"n":1}`),
		ContentType: ContentType,
	}
}

func TestNewMessage(t *testing.T) {
	t.Parallel()

	payloadDate := time.Date(2024, 1, 2, 3, 4, 5, 678000000, time.UTC)
	type255 := strings.Repeat("t", 255)

	tests := []struct {
		name     string
		edits    []docEdit
		maxBody  int
		modify   func(*Message) // applied to baseMessage to get the want
		wantBody string         // checked as a string for readable failures
	}{
		{
			name:     "ObjectID _id becomes 24 hex digits",
			wantBody: `{"n":1}`,
		},
		{
			name:     "string _id is kept",
			edits:    []docEdit{set(FieldID, "order-42-created")},
			modify:   func(m *Message) { m.ID = "order-42-created" },
			wantBody: `{"n":1}`,
		},
		{
			name:     "string _id of 255 bytes fits a message_id",
			edits:    []docEdit{set(FieldID, strings.Repeat("i", 255))},
			modify:   func(m *Message) { m.ID = strings.Repeat("i", 255) },
			wantBody: `{"n":1}`,
		},
		{
			name:     "type of 255 bytes fits a routing key",
			edits:    []docEdit{set(FieldType, type255)},
			modify:   func(m *Message) { m.Type = type255 },
			wantBody: `{"n":1}`,
		},
		{
			name: "nested payload",
			edits: []docEdit{set(FieldPayload, bson.D{
				{Key: "order", Value: bson.D{
					{Key: "id", Value: "o-1"},
					{Key: "items", Value: bson.A{int32(1), "two", bson.D{{Key: "three", Value: true}}}},
				}},
			})},
			wantBody: `{"order":{"id":"o-1","items":[1,"two",{"three":true}]}}`,
		},
		{
			name:     "date in payload is relaxed Extended JSON",
			edits:    []docEdit{set(FieldPayload, bson.D{{Key: "at", Value: bson.NewDateTimeFromTime(payloadDate)}})},
			wantBody: `{"at":{"$date":"2024-01-02T03:04:05.678Z"}}`,
		},
		{
			name:     "int64 in payload stays a plain number",
			edits:    []docEdit{set(FieldPayload, bson.D{{Key: "big", Value: int64(9007199254740993)}})},
			wantBody: `{"big":9007199254740993}`,
		},
		{
			name: "payload keeps key order and does not escape HTML",
			edits: []docEdit{set(FieldPayload, bson.D{
				{Key: "z", Value: "<a&b>"},
				{Key: "a", Value: 1.5},
			})},
			wantBody: `{"z":"<a&b>","a":1.5}`,
		},
		{
			name:     "empty payload",
			edits:    []docEdit{set(FieldPayload, bson.D{})},
			wantBody: `{}`,
		},
		{
			name:     "body exactly at the bound",
			maxBody:  len(`{"n":1}`),
			wantBody: `{"n":1}`,
		},
		{
			name:     "zero bound means unbounded",
			edits:    []docEdit{set(FieldPayload, bson.D{{Key: "s", Value: strings.Repeat("x", 1<<16)}})},
			wantBody: `{"s":"` + strings.Repeat("x", 1<<16) + `"}`,
		},
		{
			name: "aggregate fields become headers",
			edits: []docEdit{
				set(FieldAggregateType, "order"),
				set(FieldAggregateID, "o-1"),
			},
			modify: func(m *Message) {
				m.Headers = map[string]any{HeaderAggregateType: "order", HeaderAggregateID: "o-1"}
			},
			wantBody: `{"n":1}`,
		},
		{
			name: "aggregate fields override same-named event headers",
			edits: []docEdit{
				set(FieldAggregateType, "order"),
				set(FieldAggregateID, "o-1"),
				set(FieldHeaders, bson.D{
					{Key: HeaderAggregateType, Value: "spoofed"},
					{Key: HeaderAggregateID, Value: "spoofed"},
					{Key: "tenant", Value: "acme"},
				}),
			},
			modify: func(m *Message) {
				m.Headers = map[string]any{
					HeaderAggregateType: "order",
					HeaderAggregateID:   "o-1",
					"tenant":            "acme",
				}
			},
			wantBody: `{"n":1}`,
		},
		{
			name: "empty aggregate fields leave event headers alone",
			edits: []docEdit{
				set(FieldAggregateType, ""),
				set(FieldAggregateID, ""),
				set(FieldHeaders, bson.D{{Key: HeaderAggregateID, Value: "from-headers"}}),
			},
			modify: func(m *Message) {
				m.Headers = map[string]any{HeaderAggregateID: "from-headers"}
			},
			wantBody: `{"n":1}`,
		},
		{
			name: "null headers and aggregate fields are absent",
			edits: []docEdit{
				set(FieldAggregateType, nil),
				set(FieldAggregateID, nil),
				set(FieldHeaders, nil),
			},
			wantBody: `{"n":1}`,
		},
		{
			name:     "empty headers document gives no headers",
			edits:    []docEdit{set(FieldHeaders, bson.D{})},
			wantBody: `{"n":1}`,
		},
		{
			name:  "worker fields do not leak into the message",
			edits: []docEdit{set(FieldStatus, StatusProcessing), set(FieldWorkerID, "w-1"), set(FieldAttempts, int32(3))},
			// Same message as the plain NEW document.
			wantBody: `{"n":1}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := NewMessage(eventDoc(t, tt.edits...), tt.maxBody)
			if err != nil {
				t.Fatalf("NewMessage: %v", err)
			}
			want := baseMessage()
			want.Body = []byte(tt.wantBody)
			if tt.modify != nil {
				tt.modify(&want)
			}
			if diff := cmp.Diff(tt.wantBody, string(got.Body)); diff != "" {
				t.Errorf("Body (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("NewMessage (-want +got):\n%s", diff)
			}
			// cmp compares times with Equal, which ignores the zone.
			if loc := got.Timestamp.Location(); loc != time.UTC {
				t.Errorf("Timestamp location = %v, want UTC", loc)
			}
		})
	}
}

func TestNewMessageHeaderTypes(t *testing.T) {
	t.Parallel()

	headerDate := time.Date(2023, 12, 31, 23, 59, 59, 999000000, time.UTC)
	dec, err := bson.ParseDecimal128("12.50")
	if err != nil {
		t.Fatal(err)
	}
	headerID := mustObjectID("0123456789abcdef01234567")

	doc := eventDoc(t, set(FieldHeaders, bson.D{
		{Key: "string", Value: "s"},
		{Key: "int32", Value: int32(-7)},
		{Key: "int64", Value: int64(1) << 40},
		{Key: "double", Value: 2.5},
		{Key: "bool", Value: true},
		{Key: "date", Value: bson.NewDateTimeFromTime(headerDate)},
		{Key: "null", Value: nil},
		{Key: "objectId", Value: headerID},
		{Key: "decimal", Value: dec},
		{Key: "binary", Value: bson.Binary{Subtype: 0x00, Data: []byte{0xde, 0xad, 0xbe, 0xef}}},
		{Key: "doc", Value: bson.D{
			{Key: "a", Value: int32(1)},
			{Key: "inner", Value: bson.D{{Key: "b", Value: "c"}}},
		}},
		{Key: "array", Value: bson.A{"x", int64(2), bson.D{{Key: "k", Value: false}}, bson.A{nil}}},
	}))

	got, err := NewMessage(doc, 0)
	if err != nil {
		t.Fatalf("NewMessage: %v", err)
	}
	want := map[string]any{
		"string":   "s",
		"int32":    int32(-7),
		"int64":    int64(1) << 40,
		"double":   2.5,
		"bool":     true,
		"date":     headerDate,
		"null":     nil,
		"objectId": "0123456789abcdef01234567",
		"decimal":  "12.50",
		"binary":   []byte{0xde, 0xad, 0xbe, 0xef},
		"doc": map[string]any{
			"a":     int32(1),
			"inner": map[string]any{"b": "c"},
		},
		"array": []any{"x", int64(2), map[string]any{"k": false}, []any{nil}},
	}
	// cmp.Diff also checks dynamic types: int32(-7) differs from int(-7).
	if diff := cmp.Diff(want, got.Headers); diff != "" {
		t.Errorf("Headers (-want +got):\n%s", diff)
	}
	if tm, ok := got.Headers["date"].(time.Time); !ok || tm.Location() != time.UTC {
		t.Errorf("date header = %#v, want a time.Time in UTC", got.Headers["date"])
	}
}

func TestNewMessageInvalid(t *testing.T) {
	t.Parallel()

	long := strings.Repeat("k", 256)
	deep := bson.D{{Key: "leaf", Value: "x"}}
	for range maxHeaderDepth + 1 {
		deep = bson.D{{Key: "d", Value: deep}}
	}

	tests := []struct {
		name      string
		doc       bson.Raw // used instead of eventDoc(edits) when set
		edits     []docEdit
		maxBody   int
		wantField string
	}{
		{name: "_id missing", edits: []docEdit{unset(FieldID)}, wantField: FieldID},
		{name: "_id an int32", edits: []docEdit{set(FieldID, int32(42))}, wantField: FieldID},
		{name: "_id an empty string", edits: []docEdit{set(FieldID, "")}, wantField: FieldID},
		{name: "string _id over 255 bytes", edits: []docEdit{set(FieldID, strings.Repeat("i", 256))}, wantField: FieldID},
		{name: "type missing", edits: []docEdit{unset(FieldType)}, wantField: FieldType},
		{name: "type empty", edits: []docEdit{set(FieldType, "")}, wantField: FieldType},
		{name: "type not a string", edits: []docEdit{set(FieldType, int32(1))}, wantField: FieldType},
		{name: "type over 255 bytes", edits: []docEdit{set(FieldType, strings.Repeat("t", 256))}, wantField: FieldType},
		{name: "payload missing", edits: []docEdit{unset(FieldPayload)}, wantField: FieldPayload},
		{name: "payload a string", edits: []docEdit{set(FieldPayload, `{"n":1}`)}, wantField: FieldPayload},
		{name: "payload an array", edits: []docEdit{set(FieldPayload, bson.A{int32(1)})}, wantField: FieldPayload},
		{name: "payload null", edits: []docEdit{set(FieldPayload, nil)}, wantField: FieldPayload},
		{name: "body over maxBodyBytes", edits: nil, maxBody: len(`{"n":1}`) - 1, wantField: FieldPayload},
		{name: "createdAt missing", edits: []docEdit{unset(FieldCreatedAt)}, wantField: FieldCreatedAt},
		{name: "createdAt a string", edits: []docEdit{set(FieldCreatedAt, "2024-03-05T09:20:30Z")}, wantField: FieldCreatedAt},
		{name: "createdAt a timestamp", edits: []docEdit{set(FieldCreatedAt, bson.Timestamp{T: 1, I: 1})}, wantField: FieldCreatedAt},
		{name: "headers a string", edits: []docEdit{set(FieldHeaders, "tenant=acme")}, wantField: FieldHeaders},
		{name: "headers an array", edits: []docEdit{set(FieldHeaders, bson.A{"tenant"})}, wantField: FieldHeaders},
		{name: "CC header a string", edits: []docEdit{set(FieldHeaders, bson.D{{Key: "CC", Value: "audit"}})}, wantField: "headers.CC"},
		{name: "BCC header a number", edits: []docEdit{set(FieldHeaders, bson.D{{Key: "BCC", Value: 5}})}, wantField: "headers.BCC"},
		{
			name:      "header a regex",
			edits:     []docEdit{set(FieldHeaders, bson.D{{Key: "re", Value: bson.Regex{Pattern: "^a", Options: "i"}}})},
			wantField: "headers.re",
		},
		{
			name:      "header JavaScript code",
			edits:     []docEdit{set(FieldHeaders, bson.D{{Key: "js", Value: bson.JavaScript("function() {}")}})},
			wantField: "headers.js",
		},
		{
			name:      "header a timestamp",
			edits:     []docEdit{set(FieldHeaders, bson.D{{Key: "ts", Value: bson.Timestamp{T: 1700000000, I: 1}}})},
			wantField: "headers.ts",
		},
		{
			name:      "header minKey",
			edits:     []docEdit{set(FieldHeaders, bson.D{{Key: "min", Value: bson.MinKey{}}})},
			wantField: "headers.min",
		},
		{
			name: "bad header inside a nested document",
			edits: []docEdit{set(FieldHeaders, bson.D{
				{Key: "ok", Value: "fine"},
				{Key: "outer", Value: bson.D{{Key: "inner", Value: bson.MaxKey{}}}},
			})},
			wantField: "headers.outer.inner",
		},
		{
			name:      "bad header inside an array",
			edits:     []docEdit{set(FieldHeaders, bson.D{{Key: "list", Value: bson.A{"a", bson.Undefined{}}}})},
			wantField: "headers.list[1]",
		},
		{
			name:      "header key over 255 bytes",
			edits:     []docEdit{set(FieldHeaders, bson.D{{Key: long, Value: "v"}})},
			wantField: FieldHeaders,
		},
		{
			name:      "nested header key over 255 bytes",
			edits:     []docEdit{set(FieldHeaders, bson.D{{Key: "outer", Value: bson.D{{Key: long, Value: "v"}}}})},
			wantField: "headers.outer",
		},
		{
			name:      "headers nested too deep",
			edits:     []docEdit{set(FieldHeaders, deep)},
			wantField: "headers" + strings.Repeat(".d", maxHeaderDepth+1),
		},
		{name: "aggregateId a number", edits: []docEdit{set(FieldAggregateID, int32(7))}, wantField: FieldAggregateID},
		{name: "aggregateType a bool", edits: []docEdit{set(FieldAggregateType, true)}, wantField: FieldAggregateType},
		{name: "not BSON at all", doc: bson.Raw("not bson"), wantField: FieldDocument},
		{name: "empty input", doc: bson.Raw{}, wantField: FieldDocument},
		{name: "truncated document", doc: eventDoc(t)[:20], wantField: FieldDocument},
		{name: "document length past the end", doc: append(bson.Raw{0xff, 0, 0, 0}, eventDoc(t)[4:]...), wantField: FieldDocument},
		// Validate is shallow: it passes a string whose length prefix is 0
		// (no room for the NUL), on which the driver's accessors panic.
		{name: "malformed _id string", doc: malformedString(t, FieldID), wantField: FieldID},
		{name: "malformed type string", doc: malformedString(t, FieldType), wantField: FieldType},
		{name: "malformed aggregateId string", doc: malformedString(t, FieldAggregateID), wantField: FieldAggregateID},
		{name: "malformed header string", doc: malformedString(t, "headers.h"), wantField: "headers.h"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			doc := tt.doc
			if doc == nil {
				doc = eventDoc(t, tt.edits...)
			}
			got, err := NewMessage(doc, tt.maxBody)
			var invalid *InvalidError
			if !errors.As(err, &invalid) {
				t.Fatalf("NewMessage error = %v (%T), want *InvalidError", err, err)
			}
			if invalid.Field != tt.wantField {
				t.Errorf("Field = %q, want %q (error: %v)", invalid.Field, tt.wantField, err)
			}
			if invalid.Reason == "" {
				t.Errorf("Reason is empty")
			}
			if !strings.Contains(err.Error(), strconv.Quote(tt.wantField)) {
				t.Errorf("error %q does not name field %q", err, tt.wantField)
			}
			if diff := cmp.Diff(Message{}, got); diff != "" {
				t.Errorf("message on error is not zero (-want +got):\n%s", diff)
			}
		})
	}
}

// TestNewMessageInvalidFieldIsStable checks that a document with several
// problems always names the same field, so operators see one reason per
// event rather than one that changes between attempts.
func TestNewMessageInvalidFieldIsStable(t *testing.T) {
	t.Parallel()

	doc := eventDoc(t, set(FieldAggregateType, int32(1)), set(FieldAggregateID, int32(2)))
	var first string
	for i := range 50 {
		_, err := NewMessage(doc, 0)
		var invalid *InvalidError
		if !errors.As(err, &invalid) {
			t.Fatalf("NewMessage error = %v, want *InvalidError", err)
		}
		if i == 0 {
			first = invalid.Field
			continue
		}
		if invalid.Field != first {
			t.Fatalf("attempt %d named field %q, attempt 0 named %q", i, invalid.Field, first)
		}
	}
	if first != FieldAggregateType {
		t.Errorf("Field = %q, want %q (checked first)", first, FieldAggregateType)
	}
}

// A string _id longer than AMQP's short string fails naming its length and
// the limit, so that the lastError tells the producer what to shorten.
func TestNewMessageLongIDNamesLengthAndLimit(t *testing.T) {
	t.Parallel()
	_, err := NewMessage(eventDoc(t, set(FieldID, strings.Repeat("i", 300))), 0)
	var invalid *InvalidError
	if !errors.As(err, &invalid) || invalid.Field != FieldID {
		t.Fatalf("NewMessage error = %v, want *InvalidError on %q", err, FieldID)
	}
	for _, want := range []string{"300", "255", "message_id"} {
		if !strings.Contains(invalid.Reason, want) {
			t.Errorf("reason %q does not mention %q", invalid.Reason, want)
		}
	}
}

// TestNewMessageBrokerHeaders checks that an event cannot forge a header
// RabbitMQ sets itself: each one makes the event invalid, naming the
// header, and a look-alike name that RabbitMQ does not own passes.
func TestNewMessageBrokerHeaders(t *testing.T) {
	t.Parallel()

	tests := []struct {
		header string
		value  any
		forged bool
	}{
		{header: "x-delivery-count", value: int64(99), forged: true},
		{header: "x-delivery-count", value: int32(0), forged: true},
		{header: "X-Delivery-Count", value: "99", forged: true},
		{header: "x-death", value: bson.A{bson.D{{Key: "queue", Value: "orders"}, {Key: "count", Value: int64(3)}}}, forged: true},
		{header: "x-first-death-exchange", value: "events", forged: true},
		{header: "x-first-death-queue", value: "orders", forged: true},
		{header: "x-first-death-reason", value: "rejected", forged: true},
		{header: "x-last-death-exchange", value: "events", forged: true},
		{header: "x-last-death-queue", value: "orders", forged: true},
		{header: "x-last-death-reason", value: "delivery_limit", forged: true},
		{header: "x-first-death-anything", value: "later versions", forged: true},
		{header: "x-received-from", value: bson.A{bson.D{{Key: "uri", Value: "amqp://upstream"}}}, forged: true},
		{header: "x-shovelled", value: bson.A{}, forged: true},
		{header: "x-shovelled-timestamp", value: int64(1700000000), forged: true},
		{header: "x-stream-offset", value: int64(0), forged: true},
		{header: "x-mqtt-publish-qos", value: int32(1), forged: true},
		{header: "x-mqtt-dup", value: true, forged: true},
		{header: "x-amqp-1.0-properties", value: "x", forged: true},
		// Not the broker's: sender-selected or the producer's own.
		{header: "x-deaths", value: "mine"},
		{header: "x-delivery-counter", value: int32(1)},
		{header: "x-stream-filter-value", value: "eu"},
		{header: "x-delay", value: int32(1000)},
		{header: "CC", value: bson.A{"audit"}},
		{header: "tenant", value: "acme"},
	}
	for _, tt := range tests {
		t.Run(tt.header, func(t *testing.T) {
			t.Parallel()
			doc := eventDoc(t, set(FieldHeaders, bson.D{{Key: tt.header, Value: tt.value}}))
			m, err := NewMessage(doc, 0)
			if !tt.forged {
				if err != nil {
					t.Fatalf("NewMessage error = %v, want none: %q is not the broker's", err, tt.header)
				}
				if _, ok := m.Headers[tt.header]; !ok {
					t.Errorf("header %q is missing from the message", tt.header)
				}
				return
			}
			var invalid *InvalidError
			if !errors.As(err, &invalid) {
				t.Fatalf("NewMessage error = %v (%T), want *InvalidError", err, err)
			}
			if want := "headers." + tt.header; invalid.Field != want {
				t.Errorf("Field = %q, want %q", invalid.Field, want)
			}
			if !strings.Contains(err.Error(), "RabbitMQ sets itself") {
				t.Errorf("error %q does not say that RabbitMQ owns the header", err)
			}
		})
	}
}

// A broker header's name nested inside a table of the producer's own is
// only a key of that table: RabbitMQ reads the top level only.
func TestNewMessageBrokerHeaderNestedIsAllowed(t *testing.T) {
	t.Parallel()
	doc := eventDoc(t, set(FieldHeaders, bson.D{{Key: "trace", Value: bson.D{{Key: "x-death", Value: "n/a"}}}}))
	if _, err := NewMessage(doc, 0); err != nil {
		t.Fatalf("NewMessage error = %v, want none", err)
	}
}
