package events

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// A sequence is a whole number of 0 or more in any numeric type a
// producer's driver writes; anything else is poison naming the field.
func TestSequence(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		value   any // nil: no sequence field
		want    int64
		ok      bool
		wantErr string
	}{
		{name: "missing"},
		{name: "null", value: bson.Null{}},
		{name: "int32", value: int32(7), want: 7, ok: true},
		{name: "int64", value: int64(1) << 40, want: 1 << 40, ok: true},
		{name: "zero", value: int32(0), want: 0, ok: true},
		{name: "whole double", value: 12.0, want: 12, ok: true},
		{name: "largest exact double", value: float64(1 << 53), want: 1 << 53, ok: true},
		{name: "negative", value: int64(-1), wantErr: `field "sequence" must be a whole number of 0 or more (the aggregate's version), got -1`},
		{name: "negative double", value: -2.0, wantErr: `got double -2`},
		{name: "fraction", value: 1.5, wantErr: `got double 1.5`},
		{name: "NaN", value: math.NaN(), wantErr: `got double NaN`},
		{name: "infinity", value: math.Inf(1), wantErr: `got double +Inf`},
		{name: "too large a double", value: float64(1<<53) * 2, wantErr: `got double 1.8014398509481984e+16`},
		{name: "string", value: "3", wantErr: `got string`},
		{name: "decimal", value: bson.NewDecimal128(0, 3), wantErr: `got decimal`},
		{name: "document", value: bson.D{{Key: "v", Value: 1}}, wantErr: `got object`},
		{name: "bool", value: true, wantErr: `got bool`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var doc bson.Raw
			if tt.value == nil {
				doc = eventDoc(t)
			} else {
				doc = eventDoc(t, set(FieldSequence, tt.value))
			}
			n, ok, err := Sequence(doc)
			if tt.wantErr != "" {
				var ie *InvalidError
				if !errors.As(err, &ie) || ie.Field != FieldSequence {
					t.Fatalf("Sequence = %v, %v, %v; want an InvalidError naming %q", n, ok, err, FieldSequence)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("error %q does not say %q", err, tt.wantErr)
				}
				if _, merr := NewMessage(doc, 0); merr == nil || merr.Error() != err.Error() {
					t.Errorf("NewMessage = %v; want the same error as Sequence", merr)
				}
				return
			}
			if err != nil || n != tt.want || ok != tt.ok {
				t.Fatalf("Sequence = %v, %v, %v; want %v, %v, nil", n, ok, err, tt.want, tt.ok)
			}
		})
	}
}

// The message carries the sequence as x-aggregate-sequence, an int64,
// whatever numeric type stored it, and it wins over an event header of
// that name; the CloudEvents formats carry the sequence extension as a
// string that orders as the numbers do.
func TestSequenceInMessage(t *testing.T) {
	t.Parallel()
	doc := eventDoc(t,
		set(FieldAggregateType, "order"), set(FieldAggregateID, "o-1"), set(FieldSequence, 9.0),
		set(FieldHeaders, bson.D{{Key: HeaderSequence, Value: "forged"}, {Key: "cloudEvents_sequence", Value: "forged"}}))
	m, err := NewMessage(doc, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Headers[HeaderSequence]; got != int64(9) {
		t.Errorf("header %s = %#v; want int64(9)", HeaderSequence, got)
	}

	bin, err := Format{Name: FormatCloudEventsBinary, Source: "/s"}.NewMessage(doc, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := bin.Headers[PrefixAMQP+"sequence"]; got != "0000000000000000009" {
		t.Errorf("binary mode: %ssequence = %#v; want the zero-padded string", PrefixAMQP, got)
	}
	withoutAMQP10(t, PrefixAMQP, bin.Headers)

	st, err := Format{Name: FormatCloudEventsStructured, Source: "/s"}.NewMessage(doc, 0)
	if err != nil {
		t.Fatal(err)
	}
	var env map[string]any
	if err := json.Unmarshal(st.Body, &env); err != nil {
		t.Fatal(err)
	}
	if got := env["sequence"]; got != "0000000000000000009" {
		t.Errorf("structured mode: sequence = %#v; want the zero-padded string", got)
	}
	if a, b := sequenceString(9), sequenceString(10); a >= b {
		t.Errorf("sequenceString(9) = %q sorts after sequenceString(10) = %q", a, b)
	}

	plain, err := NewMessage(eventDoc(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := plain.Headers[HeaderSequence]; ok {
		t.Errorf("an event without a sequence has header %s", HeaderSequence)
	}
}

// The producer helper writes the caller's sequence as a 64-bit integer,
// none when it is nil, and refuses a negative one.
func TestDraftSequence(t *testing.T) {
	t.Parallel()
	seq := int64(4)
	doc, err := Draft{Type: "t", Payload: bson.D{}, AggregateID: "a", Sequence: &seq}.Document(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := bson.Marshal(doc)
	if v := bson.Raw(raw).Lookup(FieldSequence); v.Type != bson.TypeInt64 || v.Int64() != 4 {
		t.Errorf("stored sequence = %v; want int64 4", v)
	}
	doc, err = Draft{Type: "t", Payload: bson.D{}}.Document(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	raw, _ = bson.Marshal(doc)
	if _, err := bson.Raw(raw).LookupErr(FieldSequence); err == nil {
		t.Error("a draft without a sequence stored one")
	}
	neg := int64(-1)
	if _, err := (Draft{Type: "t", Payload: bson.D{}, Sequence: &neg}).Document(time.Now()); !errors.Is(err, ErrInvalidDraft) {
		t.Errorf("a negative sequence: %v; want ErrInvalidDraft", err)
	}
}

// SortBySequence orders each aggregate's sequenced events by sequence in
// the places they hold, and leaves every other event where it is.
func TestSortBySequence(t *testing.T) {
	t.Parallel()
	ev := func(id, agg string, at int, seq any) bson.Raw {
		edits := []docEdit{set(FieldID, id), set(FieldCreatedAt, bson.NewDateTimeFromTime(time.UnixMilli(int64(at))))}
		if agg != "" {
			edits = append(edits, set(FieldAggregateID, agg))
		}
		if seq != nil {
			edits = append(edits, set(FieldSequence, seq))
		}
		return eventDoc(t, edits...)
	}
	docs := []bson.Raw{
		ev("a3", "a", 1, int64(3)),
		ev("x", "", 2, int64(1)), // no aggregate: not ordered
		ev("b-", "b", 3, nil),    // b mixes: its unsequenced event keeps its place
		ev("a1", "a", 4, int32(1)),
		ev("b2", "b", 5, int64(2)),
		ev("bad", "a", 6, "2"), // invalid: ordered as without one
		ev("b1", "b", 7, int64(1)),
		ev("a2", "a", 8, 2.0),
		ev("a2bis", "a", 9, int64(2)), // a repeat keeps its claim order
	}
	SortBySequence(docs, func(d bson.Raw) bson.Raw { return d })
	var got []string
	for _, d := range docs {
		got = append(got, d.Lookup(FieldID).StringValue())
	}
	want := []string{"a1", "x", "b-", "a2", "b1", "bad", "b2", "a2bis", "a3"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
	if CompareInKey(docs[0], docs[8]) >= 0 || CompareInKey(docs[3], docs[7]) >= 0 {
		t.Error("CompareInKey does not put a1 before a3, or a2 before a2bis")
	}
}
