package events

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"
)

type orderCreated struct {
	OrderID string `bson:"orderId"`
	Total   int64  `bson:"total"`
}

func TestDraftDocument(t *testing.T) {
	t.Parallel()

	// now is in a zone other than UTC; the document must store UTC.
	now := time.Date(2024, 3, 5, 10, 20, 30, 0, time.FixedZone("CET", 3600))
	payload := orderCreated{OrderID: "o-1", Total: 4200}
	// doc is the document of a NEW order.created event with this _id and
	// payload, created now, followed by extra.
	doc := func(id, payload any, extra ...bson.E) bson.D {
		return append(bson.D{
			{Key: FieldID, Value: id},
			{Key: FieldType, Value: "order.created"},
			{Key: FieldPayload, Value: marshal(t, payload)},
			{Key: FieldStatus, Value: StatusNew},
			{Key: FieldCreatedAt, Value: now.UTC()},
		}, extra...)
	}

	tests := []struct {
		name  string
		draft Draft
		// want is the expected document; a nil _id value stands for "a
		// fresh ObjectID", checked separately.
		want bson.D
	}{
		{
			name:  "defaults",
			draft: Draft{Type: "order.created", Payload: payload},
			want:  doc(nil, payload),
		},
		{
			name:  "keeps a string ID",
			draft: Draft{ID: "order-1-created", Type: "order.created", Payload: payload},
			want:  doc("order-1-created", payload),
		},
		{
			name:  "keeps an ObjectID",
			draft: Draft{ID: testObjectID, Type: "order.created", Payload: bson.D{{Key: "n", Value: int32(1)}}},
			want:  doc(testObjectID, bson.D{{Key: "n", Value: int32(1)}}),
		},
		{
			name: "aggregate fields and headers when set",
			draft: Draft{
				ID:            "e-1",
				Type:          "order.created",
				AggregateType: "order",
				AggregateID:   "o-1",
				Payload:       map[string]any{"total": int64(4200)},
				Headers:       map[string]any{"tenant": "acme"},
			},
			want: doc("e-1", map[string]any{"total": int64(4200)},
				bson.E{Key: FieldAggregateType, Value: "order"},
				bson.E{Key: FieldAggregateID, Value: "o-1"},
				bson.E{Key: FieldHeaders, Value: marshal(t, map[string]any{"tenant": "acme"})},
			),
		},
		{
			name:  "empty headers map is omitted",
			draft: Draft{ID: "e-1", Type: "order.created", Payload: payload, Headers: map[string]any{}},
			want:  doc("e-1", payload),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := tt.draft.Document(now)
			if err != nil {
				t.Fatalf("Document: %v", err)
			}
			got = withoutPartition(t, got)
			if tt.want[0].Value == nil {
				id, ok := got[0].Value.(bson.ObjectID)
				if !ok || id.IsZero() {
					t.Fatalf("_id = %#v, want a new ObjectID", got[0].Value)
				}
				tt.want[0].Value = id
			}
			if diff := cmp.Diff(tt.want, normalize(got)); diff != "" {
				t.Errorf("Document (-want +got):\n%s", diff)
			}
			for _, e := range got {
				if e.Key != FieldCreatedAt {
					continue
				}
				if at, ok := e.Value.(time.Time); !ok || at.Location() != time.UTC {
					t.Errorf("createdAt = %#v, want a time.Time in UTC", e.Value)
				}
			}
		})
	}
}

// normalize marshals the values of d that are not plain scalars, so a
// payload or headers map compares by its BSON bytes.
func normalize(d bson.D) bson.D {
	out := make(bson.D, len(d))
	for i, e := range d {
		if v, ok := e.Value.(map[string]any); ok {
			b, err := bson.Marshal(v)
			if err != nil {
				panic(err)
			}
			e.Value = bson.Raw(b)
		}
		out[i] = e
	}
	return out
}

func TestDraftDocumentNewIDs(t *testing.T) {
	t.Parallel()

	d := Draft{Type: "order.created", Payload: bson.D{}}
	a, err := d.Document(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.Document(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if a[0].Value == b[0].Value {
		t.Errorf("two documents from one draft share _id %v", a[0].Value)
	}
}

func TestDraftDocumentInvalid(t *testing.T) {
	t.Parallel()

	payload := bson.D{{Key: "n", Value: int32(1)}}
	tests := []struct {
		name    string
		draft   Draft
		wantMsg string // a fragment the error must contain
	}{
		{name: "empty type", draft: Draft{Payload: payload}, wantMsg: "type"},
		{name: "type over 255 bytes", draft: Draft{Type: strings.Repeat("t", 256), Payload: payload}, wantMsg: "type"},
		{name: "nil payload", draft: Draft{Type: "order.created"}, wantMsg: "payload"},
		{name: "int payload", draft: Draft{Type: "order.created", Payload: 42}, wantMsg: "payload"},
		{name: "string payload", draft: Draft{Type: "order.created", Payload: `{"n":1}`}, wantMsg: "payload"},
		{name: "slice payload", draft: Draft{Type: "order.created", Payload: []int{1}}, wantMsg: "payload"},
		{name: "int ID", draft: Draft{ID: 7, Type: "order.created", Payload: payload}, wantMsg: "id"},
		{name: "ObjectID pointer", draft: Draft{ID: &testObjectID, Type: "order.created", Payload: payload}, wantMsg: "id"},
		{name: "empty string ID", draft: Draft{ID: "", Type: "order.created", Payload: payload}, wantMsg: "id"},
		{name: "string ID over 255 bytes", draft: Draft{ID: strings.Repeat("i", 256), Type: "order.created", Payload: payload}, wantMsg: "255"},
		{
			name:    "CC header not an array",
			draft:   Draft{Type: "order.created", Payload: payload, Headers: map[string]any{"CC": "audit"}},
			wantMsg: "headers.CC",
		},
		{
			name:    "header RabbitMQ sets itself",
			draft:   Draft{Type: "order.created", Payload: payload, Headers: map[string]any{"x-delivery-count": 99}},
			wantMsg: "headers.x-delivery-count",
		},
		{
			name:    "header AMQP cannot carry",
			draft:   Draft{Type: "order.created", Payload: payload, Headers: map[string]any{"re": bson.Regex{Pattern: "a"}}},
			wantMsg: "headers.re",
		},
		{
			name:    "header key over 255 bytes",
			draft:   Draft{Type: "order.created", Payload: payload, Headers: map[string]any{strings.Repeat("k", 256): "v"}},
			wantMsg: "headers",
		},
		{
			name:    "header that does not marshal",
			draft:   Draft{Type: "order.created", Payload: payload, Headers: map[string]any{"ch": make(chan int)}},
			wantMsg: "headers",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			doc, err := tt.draft.Document(time.Now())
			if !errors.Is(err, ErrInvalidDraft) {
				t.Fatalf("Document error = %v, want one wrapping ErrInvalidDraft", err)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not mention %q", err, tt.wantMsg)
			}
			if doc != nil {
				t.Errorf("Document returned %v with an error, want nil", doc)
			}
		})
	}
}

// TestDraftDocumentIsPublishable checks the producer and worker halves of
// the contract agree: whatever Document accepts, NewMessage can publish.
func TestDraftDocumentIsPublishable(t *testing.T) {
	t.Parallel()

	now := time.Date(2024, 3, 5, 9, 20, 30, 123000000, time.UTC)
	drafts := map[string]Draft{
		"minimal": {Type: "order.created", Payload: bson.D{}},
		"full": {
			ID:            "order-1-created",
			Type:          strings.Repeat("t", 255),
			AggregateType: "order",
			AggregateID:   "o-1",
			Payload:       orderCreated{OrderID: "o-1", Total: 1},
			Headers: map[string]any{
				"tenant": "acme",
				"n":      int64(3),
				"at":     now,
				"tags":   []string{"a", "b"},
				"nested": map[string]any{"k": true},
			},
		},
	}
	for name, d := range drafts {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			doc, err := d.Document(now)
			if err != nil {
				t.Fatalf("Document: %v", err)
			}
			m, err := NewMessage(marshal(t, doc), 0)
			if err != nil {
				t.Fatalf("NewMessage of an accepted draft: %v", err)
			}
			if m.Type != d.Type {
				t.Errorf("Type = %q, want %q", m.Type, d.Type)
			}
			if !m.Timestamp.Equal(now) {
				t.Errorf("Timestamp = %v, want %v", m.Timestamp, now)
			}
			if d.AggregateID != "" && m.Headers[HeaderAggregateID] != d.AggregateID {
				t.Errorf("%s header = %v, want %q", HeaderAggregateID, m.Headers[HeaderAggregateID], d.AggregateID)
			}
		})
	}
}

// withoutPartition checks that doc stores the partition its key hashes to,
// as the claim works it out, and returns doc without that field.
func withoutPartition(t *testing.T, doc bson.D) bson.D {
	t.Helper()
	i := slices.IndexFunc(doc, func(e bson.E) bool { return e.Key == FieldPartition })
	if i < 0 {
		t.Fatalf("no %s in %v", FieldPartition, doc)
	}
	p, ok, err := StoredPartition(marshal(t, doc))
	if !ok || err != nil {
		t.Fatalf("StoredPartition = %d, %v, %v; want the partition of the key", p, ok, err)
	}
	return slices.Delete(slices.Clone(doc), i, i+1)
}
