package events

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// jsonDocs are payloads for the tests of appendJSON: every type it writes,
// in the shapes that change how it is written, and types it leaves to the
// driver.
func jsonDocs(t testing.TB) map[string]bson.D {
	t.Helper()
	dec, err := bson.ParseDecimal128("1.5")
	if err != nil {
		t.Fatal(err)
	}
	return map[string]bson.D{
		"empty": {},
		"strings": {
			{Key: "plain", Value: "order-00000001"},
			{Key: "empty", Value: ""},
			{Key: "quotes", Value: `say "hi" \ bye`},
			{Key: "controls", Value: "a\nb\rc\td\be\ff\x00g\x01h\x1fi\x7f"},
			{Key: "html", Value: "<a href='x'>&amp;</a>"},
			{Key: "unicode", Value: "héllo wörld 日本 😀"},
			{Key: "separators", Value: "a\u2028b\u2029c"},
			{Key: "invalid utf-8", Value: "a\xffb\xc3c\xe2\x82"},
			{Key: "key \"quoted\"\n\xff", Value: "v"},
		},
		"numbers": {
			{Key: "i32", Value: int32(-7)},
			{Key: "i32max", Value: int32(math.MaxInt32)},
			{Key: "i32min", Value: int32(math.MinInt32)},
			{Key: "i64", Value: int64(1) << 60},
			{Key: "i64min", Value: int64(math.MinInt64)},
			{Key: "zero", Value: 0.0},
			{Key: "negzero", Value: math.Copysign(0, -1)},
			{Key: "integral", Value: 42.0},
			{Key: "fraction", Value: 0.1},
			{Key: "big", Value: 1e21},
			{Key: "bigger", Value: 1.5e300},
			{Key: "small", Value: 1e-7},
			{Key: "tiny", Value: math.SmallestNonzeroFloat64},
			{Key: "max", Value: math.MaxFloat64},
			{Key: "inf", Value: math.Inf(1)},
			{Key: "neginf", Value: math.Inf(-1)},
			{Key: "nan", Value: math.NaN()},
		},
		"others": {
			{Key: "true", Value: true},
			{Key: "false", Value: false},
			{Key: "null", Value: nil},
			{Key: "oid", Value: testObjectID},
			{Key: "date", Value: bson.NewDateTimeFromTime(testCreatedAt)},
			{Key: "epoch", Value: bson.DateTime(0)},
			{Key: "whole second", Value: bson.NewDateTimeFromTime(time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC))},
			{Key: "before 1970", Value: bson.DateTime(-1)},
			{Key: "year 9999", Value: bson.NewDateTimeFromTime(time.Date(9999, 12, 31, 23, 59, 59, 999e6, time.UTC))},
			{Key: "year 10000", Value: bson.NewDateTimeFromTime(time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC))},
			{Key: "min date", Value: bson.DateTime(math.MinInt64)},
		},
		"nested": {
			{Key: "doc", Value: bson.D{{Key: "a", Value: bson.D{{Key: "b", Value: bson.D{}}}}}},
			{Key: "array", Value: bson.A{"x", int32(1), bson.A{}, bson.A{nil, 2.5}, bson.D{{Key: "k", Value: "v"}}}},
			{Key: "empty array", Value: bson.A{}},
		},
		"driver types": {
			{Key: "s", Value: "before"},
			{Key: "bin", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}},
			{Key: "dec", Value: dec},
			{Key: "ts", Value: bson.Timestamp{T: 1, I: 2}},
			{Key: "regex", Value: bson.Regex{Pattern: "a.*", Options: "mi"}},
		},
		"driver type nested": {
			{Key: "a", Value: bson.A{bson.D{{Key: "min", Value: bson.MinKey{}}}}},
		},
		"deep": deepDoc(jsonMaxDepth + 3),
	}
}

func deepDoc(depth int) bson.D {
	d := bson.D{{Key: "leaf", Value: "x"}}
	for range depth {
		d = bson.D{{Key: "d", Value: d}}
	}
	return d
}

// TestAppendJSONMatchesDriver checks that body writes what the driver's
// MarshalExtJSON writes, through appendJSON or through the driver.
func TestAppendJSONMatchesDriver(t *testing.T) {
	t.Parallel()
	for name, d := range jsonDocs(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			raw := marshal(t, d)
			want, err := bson.MarshalExtJSON(bson.Raw(raw), false, false)
			if err != nil {
				t.Fatal(err)
			}
			doc := eventDoc(t, set(FieldPayload, bson.Raw(raw)))
			got, err := body(doc, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("body\n got %s\nwant %s", got, want)
			}
		})
	}
}

// TestAppendJSONLeavesToTheDriver checks which payloads appendJSON writes
// itself: all but those with a type it does not write, or nested deeper
// than jsonMaxDepth.
func TestAppendJSONLeavesToTheDriver(t *testing.T) {
	t.Parallel()
	for name, d := range jsonDocs(t) {
		raw := marshal(t, d)
		_, ok := appendJSON(nil, raw)
		if want := !strings.HasPrefix(name, "driver") && name != "deep"; ok != want {
			t.Errorf("%s: appendJSON ok = %t, want %t", name, ok, want)
		}
	}
}

// FuzzAppendJSON checks appendJSON against the driver on any bytes: where
// it writes a document, the driver writes the same bytes; where the driver
// fails, appendJSON leaves the document to it.
func FuzzAppendJSON(f *testing.F) {
	for _, d := range jsonDocs(f) {
		f.Add([]byte(marshal(f, d)))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		got, ok := appendJSON(nil, doc)
		if !ok {
			return
		}
		want, err := bson.MarshalExtJSON(bson.Raw(doc), false, false)
		if err != nil {
			t.Fatalf("appendJSON wrote %q where the driver fails: %v", got, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("appendJSON\n got %q\nwant %q", got, want)
		}
	})
}

func BenchmarkBody(b *testing.B) {
	doc := benchEvent(b, 1)
	payload := doc.Lookup(FieldPayload).Document()
	b.Run("appendJSON", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := body(doc, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("driver", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := bson.MarshalExtJSON(payload, false, false); err != nil {
				b.Fatal(err)
			}
		}
	})
}
