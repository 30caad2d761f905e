package claim

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// The hostile-document fuzzer generates event documents from a stream of
// choices: for each event field, keep a valid value or put one of
// hostileShapes in its place. FuzzHostileDocument checks what must hold
// for any document without servers; TestHostileFuzzCorpus relays every
// entry of its corpus (the seeds below, and whatever a fuzzing run adds
// under testdata/fuzz/FuzzHostileDocument) among valid events on a real
// relay, with the assertions of TestHostileDocuments.

var updateHostileCorpus = flag.Bool("update-hostile-corpus", false,
	"rewrite testdata/fuzz/FuzzHostileDocument from hostileSeeds")

// hostileFields are the fields the generator varies, in the order it
// reads choices for them. status is always NEW: the suite is about what
// the relay claims.
var hostileFields = []string{
	events.FieldID, events.FieldType, events.FieldPayload, events.FieldHeaders, events.FieldCreatedAt,
	events.FieldAggregateType, events.FieldAggregateID, events.FieldAttempts, events.FieldWorkerID,
	events.FieldClaimToken, events.FieldProcessingAt, events.FieldRetryAt, events.FieldLastError,
	"extra", events.FieldSequence,
}

// Shapes a field can take. A choice byte below shapeBase keeps the field
// valid; shapeBase+k puts shape k in its place, reading one parameter byte.
const shapeBase = 0x80

const (
	shNull = iota
	shShort
	shEmpty
	shLong // 200 + param bytes
	shInt32
	shInt64
	shDouble // NaN, +Inf or a fraction
	shBool
	shDate // in the past
	shObjectID
	shDocument // param%4 fields of random shapes
	shArray    // param%4 elements of random shapes, no nested arrays
	shBinary
	shRegex
	shDecimal
	shTimestamp
	shHuge // (param%4+1) * 64 KiB
	shMissing
	shJavaScript
	shMinKey
	shDeep // param%40 nested documents
	shCount
)

// hostileKeys are the keys of generated sub-documents (headers, payload).
var hostileKeys = []string{"CC", "BCC", "tenant", "x-trace", "", strings.Repeat("k", 256), "n", "x-death"}

// chooser reads choices from fuzz input; past its end every choice is 0.
type chooser struct {
	data []byte
	i    int
}

func (c *chooser) next() int {
	if c.i >= len(c.data) {
		return 0
	}
	b := c.data[c.i]
	c.i++
	return int(b)
}

// hostileDocument builds an event document from data, created at at.
func hostileDocument(data []byte, at time.Time) bson.D {
	c := &chooser{data: data}
	valid := eventDoc(bson.NewObjectID(), at,
		field(events.FieldHeaders, bson.D{{Key: "tenant", Value: "acme"}}),
		field(events.FieldAggregateType, "order"),
		field(events.FieldAggregateID, "o-1"))
	doc := bson.D{}
	for _, name := range hostileFields {
		choice := c.next()
		var v any = unsetValue
		for _, e := range valid {
			if e.Key == name {
				v = e.Value
			}
		}
		if choice >= shapeBase {
			v = shapeValue(c, name, (choice-shapeBase)%shCount, c.next(), 0)
		}
		if v != unsetValue {
			doc = append(doc, field(name, v))
		}
		if name == events.FieldCreatedAt {
			doc = append(doc, field(events.FieldStatus, string(events.StatusNew)))
		}
	}
	return doc
}

// shapeValue is shape with parameter p for the field name at depth, or
// unsetValue for a missing field. Some shapes are replaced where no server
// stores them (an array _id) or where they would take the event out of the
// relay's reach (a future retryAt).
func shapeValue(c *chooser, name string, shape, p, depth int) any {
	if name == events.FieldID {
		switch shape {
		case shArray, shRegex, shHuge, shJavaScript, shMinKey, shDeep:
			shape = shLong
		}
	}
	switch shape {
	case shNull:
		return nil
	case shShort:
		return "x"
	case shEmpty:
		return ""
	case shLong:
		return strings.Repeat("l", 200+p)
	case shInt32:
		return int32(p - 128)
	case shInt64:
		return int64(p) << 40
	case shDouble:
		switch p % 3 {
		case 0:
			return math.NaN()
		case 1:
			return math.Inf(1)
		}
		return float64(p) / 3
	case shBool:
		return p%2 == 0
	case shDate:
		return time.Unix(int64(p)*1e6, 0).UTC()
	case shObjectID:
		return bson.NewObjectID()
	case shDocument:
		d := bson.D{}
		if depth < 3 {
			for range p % 4 {
				k := hostileKeys[c.next()%len(hostileKeys)]
				v := shapeValue(c, k, c.next()%shCount, c.next(), depth+1)
				if v != unsetValue {
					d = append(d, field(k, v))
				}
			}
		}
		return d
	case shArray:
		a := bson.A{}
		if depth < 3 {
			for range p % 4 {
				s := c.next() % shCount
				if s == shArray || s == shMissing {
					s = shShort // FerretDB refuses arrays directly in arrays
				}
				a = append(a, shapeValue(c, "", s, c.next(), depth+1))
			}
		}
		return a
	case shBinary:
		return bson.Binary{Subtype: byte(p % 5), Data: []byte{byte(p)}}
	case shRegex:
		return bson.Regex{Pattern: "^a", Options: "i"}
	case shDecimal:
		d, _ := bson.ParseDecimal128(strconv.Itoa(p) + ".5")
		return d
	case shTimestamp:
		return bson.Timestamp{T: uint32(p), I: 1}
	case shHuge:
		return strings.Repeat("h", (p%4+1)*64<<10)
	case shMissing:
		return unsetValue
	case shJavaScript:
		return bson.JavaScript("function(){}")
	case shMinKey:
		if p%2 == 0 {
			return bson.MinKey{}
		}
		return bson.MaxKey{}
	case shDeep:
		var v any = "bottom"
		for range p % 40 {
			v = bson.D{{Key: "d", Value: v}}
		}
		return v
	}
	panic(fmt.Sprintf("shape %d", shape))
}

// seedChoices turns a map from field to choice bytes (shapeBase+shape, its
// parameter, and what the shape reads next) into fuzz input; every other
// field keeps its valid value.
func seedChoices(shapes map[string][]byte) []byte {
	var b []byte
	for _, name := range hostileFields {
		s, ok := shapes[name]
		if !ok {
			b = append(b, 0)
			continue
		}
		b = append(b, s...)
	}
	return b
}

// hostileSeeds are the named starting points of the fuzzer, and the
// corpus the relay test runs when no fuzzing has added to it.
func hostileSeeds() map[string][]byte {
	one := func(name string, shape, p int, more ...byte) []byte {
		return seedChoices(map[string][]byte{name: append([]byte{byte(shapeBase + shape), byte(p)}, more...)})
	}
	return map[string][]byte{
		"valid":                seedChoices(nil),
		"id-long":              one(events.FieldID, shLong, 100),
		"id-int32":             one(events.FieldID, shInt32, 7),
		"id-null":              one(events.FieldID, shNull, 0),
		"type-huge":            one(events.FieldType, shHuge, 0),
		"payload-deep":         one(events.FieldPayload, shDeep, 39),
		"payload-nan":          one(events.FieldPayload, shDouble, 0),
		"headers-timestamp":    one(events.FieldHeaders, shTimestamp, 1),
		"created-string":       one(events.FieldCreatedAt, shShort, 0),
		"attempts-int64":       one(events.FieldAttempts, shInt64, 1),
		"attempts-decimal":     one(events.FieldAttempts, shDecimal, 2),
		"attempts-missing":     one(events.FieldAttempts, shMissing, 0),
		"worker-id-document":   one(events.FieldWorkerID, shDocument, 0),
		"claim-token-minkey":   one(events.FieldClaimToken, shMinKey, 0),
		"processing-at-array":  one(events.FieldProcessingAt, shArray, 0),
		"retry-at-timestamp":   one(events.FieldRetryAt, shTimestamp, 3),
		"last-error-huge":      one(events.FieldLastError, shHuge, 3),
		"aggregate-type-regex": one(events.FieldAggregateType, shRegex, 0),
		"extra-javascript":     one("extra", shJavaScript, 0),
		// The aggregate's version: valid ones (a large int64, a whole
		// double) and each kind of hostile one.
		"sequence-int64":     one(events.FieldSequence, shInt64, 3),
		"sequence-negative":  one(events.FieldSequence, shInt32, 1),
		"sequence-string":    one(events.FieldSequence, shShort, 0),
		"sequence-fraction":  one(events.FieldSequence, shDouble, 2),
		"sequence-infinity":  one(events.FieldSequence, shDouble, 1),
		"sequence-decimal":   one(events.FieldSequence, shDecimal, 4),
		"sequence-document":  one(events.FieldSequence, shDocument, 1, 2, shInt32, 200),
		"sequence-null":      one(events.FieldSequence, shNull, 0),
		"sequence-timestamp": one(events.FieldSequence, shTimestamp, 5),
		// A headers document reads, per field, a key index into
		// hostileKeys, a shape and its parameter.
		"headers-cc-string": one(events.FieldHeaders, shDocument, 1, 0, shShort, 0),
		"headers-two-huge":  one(events.FieldHeaders, shDocument, 2, 2, shHuge, 3, 3, shHuge, 3),
		"headers-empty-key": one(events.FieldHeaders, shDocument, 1, 4, shInt32, 9),
	}
}

const hostileCorpusDir = "testdata/fuzz/FuzzHostileDocument"

// FuzzHostileDocument starts from the checked-in corpus (hostileSeeds).
func FuzzHostileDocument(f *testing.F) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	f.Fuzz(func(t *testing.T, data []byte) {
		doc := hostileDocument(data, at)
		raw := testenv.Marshal(t, doc)
		if len(raw) >= maxDocumentBytes {
			t.Skip("larger than a server stores")
		}
		checkNewMessage(t, raw)
	})
}

// checkNewMessage checks what NewMessage promises for any document: no
// panic; an error is an *events.InvalidError naming a field the document
// has or lacks; a message has the document's identity, a routing key that
// fits, and a JSON body within the bound.
func checkNewMessage(t *testing.T, raw bson.Raw) {
	t.Helper()
	m, err := events.NewMessage(raw, hostileMaxBody)
	if err != nil {
		var ie *events.InvalidError
		if !errors.As(err, &ie) {
			t.Fatalf("NewMessage error %v is not an *events.InvalidError", err)
		}
		top := strings.FieldsFunc(ie.Field, func(r rune) bool { return r == '.' || r == '[' })
		if len(top) == 0 || (!isHostileField(top[0]) && top[0] != events.FieldDocument) {
			t.Fatalf("NewMessage error names field %q, not an event field", ie.Field)
		}
		return
	}
	id, _ := raw.LookupErr(events.FieldID)
	if m.ID == "" || m.ID != docKey(id) {
		t.Errorf("message id %q, want the document's _id %s", trim(m.ID), trim(id.String()))
	}
	if m.Type == "" || len(m.Type) > 255 {
		t.Errorf("routing key of %d bytes", len(m.Type))
	}
	if len(m.Body) > hostileMaxBody || !json.Valid(m.Body) {
		t.Errorf("body of %d bytes (bound %d), valid JSON: %t", len(m.Body), hostileMaxBody, json.Valid(m.Body))
	}
}

func isHostileField(name string) bool {
	for _, f := range hostileFields {
		if f == name {
			return true
		}
	}
	return name == events.FieldStatus
}

// TestHostileFuzzSeedCorpus keeps the checked-in corpus in step with
// hostileSeeds; -update-hostile-corpus rewrites it.
func TestHostileFuzzSeedCorpus(t *testing.T) {
	t.Parallel()
	for name, seed := range hostileSeeds() {
		path := filepath.Join(hostileCorpusDir, name)
		want := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", seed)
		if *updateHostileCorpus {
			if err := os.MkdirAll(hostileCorpusDir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != want {
			t.Errorf("corpus entry %s is missing or stale (err %v); run go test ./claim -run TestHostileFuzzSeedCorpus -update-hostile-corpus", path, err)
		}
	}
}

// readHostileCorpus reads every entry of the fuzz corpus: the seeds and
// whatever fuzzing added.
func readHostileCorpus(t *testing.T) map[string][]byte {
	t.Helper()
	entries, err := os.ReadDir(hostileCorpusDir)
	if err != nil {
		t.Fatalf("read the fuzz corpus: %v", err)
	}
	out := make(map[string][]byte, len(entries))
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(hostileCorpusDir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) != 2 || lines[0] != "go test fuzz v1" ||
			!strings.HasPrefix(lines[1], "[]byte(") || !strings.HasSuffix(lines[1], ")") {
			t.Fatalf("corpus entry %s: not one []byte value in the go test fuzz v1 format", e.Name())
		}
		s, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")"))
		if err != nil {
			t.Fatalf("corpus entry %s: %v", e.Name(), err)
		}
		out[e.Name()] = []byte(s)
	}
	return out
}

// ferretRefuses names the first value in doc that FerretDB v1.24.0 cannot
// store: a Decimal128, a NaN or an infinity, a MinKey or MaxKey, or
// JavaScript code.
func ferretRefuses(doc bson.Raw) string {
	elems, err := doc.Elements()
	if err != nil {
		return ""
	}
	for _, e := range elems {
		if what := ferretRefusesValue(e.Value()); what != "" {
			return what + " in " + e.Key()
		}
	}
	return ""
}

func ferretRefusesValue(v bson.RawValue) string {
	switch v.Type {
	case bson.TypeDecimal128, bson.TypeMinKey, bson.TypeMaxKey, bson.TypeJavaScript, bson.TypeCodeWithScope:
		return v.Type.String()
	case bson.TypeDouble:
		if f, ok := v.DoubleOK(); ok && math.IsNaN(f) {
			return "a NaN"
		}
		if f, ok := v.DoubleOK(); ok && math.IsInf(f, 0) {
			return "an infinity" // refused with a write error
		}
	case bson.TypeEmbeddedDocument:
		if d, ok := v.DocumentOK(); ok {
			return ferretRefuses(d)
		}
	case bson.TypeArray:
		if a, ok := v.ArrayOK(); ok {
			return ferretRefuses(bson.Raw(a))
		}
	}
	return ""
}

// TestHostileFuzzCorpus relays each document of the fuzz corpus among
// valid events: it must not stop the relay.
func TestHostileFuzzCorpus(t *testing.T) {
	t.Parallel()
	for name, data := range readHostileCorpus(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if testenv.IsFerretDB() {
				raw := testenv.Marshal(t, hostileDocument(data, time.Now()))
				if what := ferretRefuses(raw); what != "" {
					t.Skipf("FerretDB v1.24.0 cannot store %s (it drops the connection); "+
						"this entry runs against MongoDB (OUTBOX_TEST_MONGO_URI)", what)
				}
			}
			// A FAILED one must name a field of the event, any one: the
			// generator does not know which of its choices is at fault.
			var fields []string
			for _, f := range append(slices.Clone(hostileFields), events.FieldDocument) {
				switch f {
				case events.FieldType, events.FieldPayload, events.FieldHeaders, "extra":
					// Words an error may use for other reasons: quoted only,
					// alone or as the start of a path ("headers.CC").
					fields = append(fields, `"`+f+`"`, "'"+f+"'", `"`+f+`.`, `"`+f+`[`)
				default:
					fields = append(fields, f)
				}
			}
			relayHostile(t, Config{MaxBodyBytes: hostileMaxBody}, []hostileDoc{{
				doc:     func(_ *testing.T, at time.Time) any { return hostileDocument(data, at) },
				want:    wantDeliveredOrFailed,
				mention: [][]string{fields},
			}})
		})
	}
}
