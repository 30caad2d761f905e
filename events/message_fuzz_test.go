package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// fuzzMaxBody is the body bound FuzzNewMessage passes, small enough that
// the fuzzer reaches the oversized-body branch.
const fuzzMaxBody = 256

var updateCorpus = flag.Bool("update", false, "rewrite testdata/fuzz/FuzzNewMessage from fuzzSeeds")

// fuzzSeeds returns the named documents FuzzNewMessage starts from: valid
// events and poison ones. They are also checked in under
// testdata/fuzz/FuzzNewMessage so plain `go test` runs them; after
// changing this list, run `go test ./events -run TestFuzzSeedCorpus -update`.
func fuzzSeeds(t testing.TB) map[string][]byte {
	t.Helper()
	dec, err := bson.ParseDecimal128("-0.001")
	if err != nil {
		t.Fatal(err)
	}
	allHeaders := bson.D{
		{Key: "s", Value: "v"},
		{Key: "i", Value: int32(1)},
		{Key: "l", Value: int64(2)},
		{Key: "f", Value: 0.5},
		{Key: "b", Value: false},
		{Key: "t", Value: bson.NewDateTimeFromTime(time.Unix(0, 0))},
		{Key: "n", Value: nil},
		{Key: "o", Value: testObjectID},
		{Key: "d", Value: dec},
		{Key: "x", Value: bson.Binary{Data: []byte{1, 2}}},
		{Key: "m", Value: bson.D{{Key: "k", Value: "v"}}},
		{Key: "a", Value: bson.A{"v", int32(1), bson.A{}}},
	}
	docs := map[string]bson.Raw{
		"valid-minimal":   eventDoc(t),
		"valid-string-id": eventDoc(t, set(FieldID, "order-1")),
		"valid-aggregate": eventDoc(t, set(FieldAggregateType, "order"), set(FieldAggregateID, "o-1")),
		"valid-headers":   eventDoc(t, set(FieldHeaders, allHeaders)),
		"valid-payload": eventDoc(t, set(FieldPayload, bson.D{
			{Key: "at", Value: bson.NewDateTimeFromTime(testCreatedAt)},
			{Key: "big", Value: int64(1) << 60},
			{Key: "nested", Value: bson.D{{Key: "a", Value: bson.A{1.5, "x", nil}}}},
			{Key: "bin", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}},
		})),
		"poison-type-missing":   eventDoc(t, unset(FieldType)),
		"poison-type-long":      eventDoc(t, set(FieldType, strings.Repeat("t", 256))),
		"poison-payload-array":  eventDoc(t, set(FieldPayload, bson.A{int32(1)})),
		"poison-payload-big":    eventDoc(t, set(FieldPayload, bson.D{{Key: "s", Value: strings.Repeat("x", fuzzMaxBody)}})),
		"poison-created-string": eventDoc(t, set(FieldCreatedAt, "yesterday")),
		"poison-header-regex":   eventDoc(t, set(FieldHeaders, bson.D{{Key: "r", Value: bson.Regex{Pattern: "a"}}})),
		"poison-header-deep":    eventDoc(t, set(FieldHeaders, bson.D{{Key: "a", Value: bson.A{bson.D{{Key: "ts", Value: bson.Timestamp{T: 1}}}}}})),
		"poison-aggregate-id":   eventDoc(t, set(FieldAggregateID, int64(7))),
		"poison-id-int":         eventDoc(t, set(FieldID, int32(1))),
		"poison-not-bson":       bson.Raw("\x05\x00\x00\x00\x01"),
	}
	seeds := make(map[string][]byte, len(docs))
	for name, d := range docs {
		seeds[name] = d
	}
	return seeds
}

func FuzzNewMessage(f *testing.F) {
	for _, seed := range fuzzSeeds(f) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		orig := bytes.Clone(data)
		m, err := NewMessage(bson.Raw(data), fuzzMaxBody)
		if !bytes.Equal(orig, data) {
			t.Fatal("NewMessage modified its input")
		}
		if err != nil {
			var invalid *InvalidError
			if !errors.As(err, &invalid) {
				t.Fatalf("error %v (%T) is not an *InvalidError", err, err)
			}
			if invalid.Field == "" {
				t.Fatalf("error %v names no field", err)
			}
			if diff := cmp.Diff(Message{}, m); diff != "" {
				t.Fatalf("message on error is not zero (-want +got):\n%s", diff)
			}
			// The same document must be rejected for the same reason every
			// time: operators read it off the FAILED event.
			_, again := NewMessage(bson.Raw(data), fuzzMaxBody)
			if again == nil || again.Error() != err.Error() {
				t.Fatalf("second call returned %v, first %v", again, err)
			}
			return
		}
		if m.ID == "" {
			t.Error("ID is empty")
		}
		if m.Type == "" || len(m.Type) > maxShortString {
			t.Errorf("Type %q has %d bytes, want 1 to %d", m.Type, len(m.Type), maxShortString)
		}
		if !json.Valid(m.Body) {
			t.Errorf("Body is not valid JSON: %q", m.Body)
		}
		if len(m.Body) > fuzzMaxBody {
			t.Errorf("Body has %d bytes, over the bound of %d", len(m.Body), fuzzMaxBody)
		}
		if m.Timestamp.Location() != time.UTC {
			t.Errorf("Timestamp %v is not in UTC", m.Timestamp)
		}
		for k := range m.Headers {
			if len(k) > maxShortString {
				t.Errorf("header key of %d bytes", len(k))
			}
		}
	})
}

// TestFuzzSeedCorpus checks that the seed files under testdata match
// fuzzSeeds, and rewrites them with -update.
func TestFuzzSeedCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzNewMessage")
	seeds := fuzzSeeds(t)
	if *updateCorpus {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, data := range seeds {
			if err := os.WriteFile(filepath.Join(dir, name), corpusFile(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name, data := range seeds {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("seed %s: %v (run with -update)", name, err)
			continue
		}
		if !bytes.Equal(got, corpusFile(data)) {
			t.Errorf("seed file %s is stale (run with -update)", name)
		}
	}
}

// corpusFile encodes one []byte input in the format of go test fuzz files.
func corpusFile(data []byte) []byte {
	return fmt.Appendf(nil, "go test fuzz v1\n[]byte(%s)\n", strconv.Quote(string(data)))
}
