package claim

// The hostile-document suite: no single document in the outbox may stop
// the relay. Each class of hostile document is put among hostileValid
// valid events and relayed by a real claimer (mongo.Store on FerretDB or
// OUTBOX_TEST_MONGO_URI, broker.Publisher on RabbitMQ). Whatever the
// hostile document is, every valid event must be delivered within
// hostileValidRuns claim runs, the hostile one must end delivered or FAILED
// with a lastError that names its field (and its limit, where it broke
// one), no run may fail or panic, the publisher must be ready again after
// every run, and nothing may be left PROCESSING.

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
)

const (
	// hostileValid is how many valid events surround the hostile ones.
	hostileValid = 200
	// hostileValidRuns is how many claim runs may pass before every valid
	// event is PUBLISHED: the run that claims them, plus one more for the
	// events a broker-side failure of the hostile message sent back to NEW.
	hostileValidRuns = 2
	// hostileMaxRuns is how many runs a case gets for its hostile events
	// to settle as PUBLISHED or FAILED.
	hostileMaxRuns = 4
	// hostileMaxBody is the body bound (OUTBOX_MAX_MESSAGE_BYTES) of the
	// cases that do not need the default: small, so a small payload breaks it.
	hostileMaxBody = 4096
	// maxDocumentBytes is MongoDB's largest document (and FerretDB's).
	maxDocumentBytes = 16 << 20
)

// want is what may become of a hostile event.
type want int

const (
	// wantFailed: it must end FAILED.
	wantFailed want = iota
	// wantDeliveredOrFailed: delivered (under its own message id), or
	// FAILED; a worker may repair what it manages itself.
	wantDeliveredOrFailed
)

func (w want) String() string {
	if w == wantFailed {
		return "FAILED"
	}
	return "delivered or FAILED"
}

// hostileDoc is one hostile document and what the relay must make of it.
type hostileDoc struct {
	// doc builds the document, created at createdAt (which puts it among
	// the valid events; a document may ignore it).
	doc  func(t *testing.T, createdAt time.Time) any
	want want
	// mention lists what a FAILED event's lastError must contain, each
	// entry satisfied by any one of its alternatives (case-insensitive).
	mention [][]string
}

type hostileCase struct {
	name string
	// cfg is the claimer's configuration; MaxBodyBytes defaults to
	// hostileMaxBody here.
	cfg     Config
	hostile []hostileDoc
}

// negotiatedFrameSize is the frame size RabbitMQ negotiates with a client
// that asks for nothing, as the worker's publisher does.
func negotiatedFrameSize(t *testing.T) int {
	t.Helper()
	conn, err := amqp.Dial(testenv.AMQPURL(t))
	if err != nil {
		t.Fatalf("dial RabbitMQ: %v", err)
	}
	defer conn.Close()
	return conn.Config.FrameSize
}

// eventDoc is a valid NEW event document with _id id, created at at, with
// fields set (replaced or appended) as given.
func eventDoc(id any, at time.Time, fields ...bson.E) bson.D {
	d := bson.D{
		{Key: events.FieldID, Value: id},
		{Key: events.FieldType, Value: "order.created"},
		{Key: events.FieldPayload, Value: bson.D{{Key: "n", Value: 1}}},
		{Key: events.FieldStatus, Value: string(events.StatusNew)},
		{Key: events.FieldCreatedAt, Value: at},
	}
	for _, f := range fields {
		i := slices.IndexFunc(d, func(e bson.E) bool { return e.Key == f.Key })
		switch {
		case i >= 0 && f.Value == unsetValue:
			d = slices.Delete(d, i, i+1)
		case i >= 0:
			d[i] = f
		case f.Value != unsetValue:
			d = append(d, f)
		}
	}
	return d
}

// unsetValue, as a field's value in eventDoc, removes the field.
var unsetValue = &struct{ unset bool }{true}

func field(k string, v any) bson.E { return bson.E{Key: k, Value: v} }

// simple is a hostile document that is eventDoc with fields changed.
func simple(id string, w want, mention [][]string, fields ...bson.E) hostileDoc {
	return hostileDoc{
		doc:     func(_ *testing.T, at time.Time) any { return eventDoc(id, at, fields...) },
		want:    w,
		mention: mention,
	}
}

// any1 is one mention: any of the alternatives.
func any1(alts ...string) []string { return alts }

func hostileCases(t *testing.T) []hostileCase {
	frame := negotiatedFrameSize(t)
	longID := strings.Repeat("i", 300)
	// A few hundred KiB of headers: several values, each within AMQP's
	// long string, together far beyond one frame.
	bigHeaders := bson.D{}
	for i := range 4 {
		bigHeaders = append(bigHeaders, field(fmt.Sprintf("h%d", i), strings.Repeat("h", 100<<10)))
	}
	deep := bson.D{{Key: "v", Value: 1}}
	for range 20 {
		deep = bson.D{{Key: "d", Value: deep}}
	}
	return []hostileCase{
		// AMQP's message_id is a short string of at most 255 bytes.
		{name: "id-longer-than-255", hostile: []hostileDoc{{
			doc:     func(_ *testing.T, at time.Time) any { return eventDoc(longID, at) },
			want:    wantFailed,
			mention: [][]string{any1(`_id`), any1("255")},
		}}},
		// The content header frame carries the headers and must fit in
		// frame_max (131072 by default).
		{name: "headers-larger-than-frame", hostile: []hostileDoc{simple("big-headers", wantFailed,
			[][]string{any1("headers"), any1(strconv.Itoa(frame))}, field(events.FieldHeaders, bigHeaders))}},
		{name: "body-larger-than-max", hostile: []hostileDoc{simple("big-body", wantFailed,
			[][]string{any1("payload"), any1(strconv.Itoa(hostileMaxBody))},
			field(events.FieldPayload, bson.D{{Key: "blob", Value: strings.Repeat("b", 2*hostileMaxBody)}}))}},

		// Worker-managed fields of the wrong type. The claim increments
		// attempts and sets the others; a null may be repaired.
		{name: "attempts-null", hostile: []hostileDoc{simple("attempts-null", wantDeliveredOrFailed,
			[][]string{any1("attempts")}, field(events.FieldAttempts, nil))}},
		{name: "attempts-string", hostile: []hostileDoc{simple("attempts-string", wantDeliveredOrFailed,
			[][]string{any1("attempts")}, field(events.FieldAttempts, "3"))}},
		{name: "attempts-document", hostile: []hostileDoc{simple("attempts-document", wantDeliveredOrFailed,
			[][]string{any1("attempts")}, field(events.FieldAttempts, bson.D{{Key: "n", Value: 1}}))}},
		{name: "processingAt-string", hostile: []hostileDoc{simple("processing-at-string", wantDeliveredOrFailed,
			[][]string{any1("processingAt")}, field(events.FieldProcessingAt, "yesterday"))}},
		{name: "retryAt-string", hostile: []hostileDoc{simple("retry-at-string", wantDeliveredOrFailed,
			[][]string{any1("retryAt")}, field(events.FieldRetryAt, "tomorrow"))}},
		{name: "claimToken-number", hostile: []hostileDoc{simple("claim-token-number", wantDeliveredOrFailed,
			[][]string{any1("claimToken")}, field(events.FieldClaimToken, 42))}},
		{name: "workerId-number", hostile: []hostileDoc{simple("worker-id-number", wantDeliveredOrFailed,
			[][]string{any1("workerId")}, field(events.FieldWorkerID, 7))}},
		{name: "retryAt-null", hostile: []hostileDoc{simple("retry-at-null", wantDeliveredOrFailed,
			[][]string{any1("retryAt")}, field(events.FieldRetryAt, nil))}},
		{name: "workerId-null", hostile: []hostileDoc{simple("worker-id-null", wantDeliveredOrFailed,
			[][]string{any1("workerId")}, field(events.FieldWorkerID, nil))}},
		{name: "attempts-negative", hostile: []hostileDoc{simple("attempts-negative", wantDeliveredOrFailed,
			[][]string{any1("attempts")}, field(events.FieldAttempts, -5))}},
		{name: "attempts-double", hostile: []hostileDoc{simple("attempts-double", wantDeliveredOrFailed,
			[][]string{any1("attempts")}, field(events.FieldAttempts, 2.5))}},

		// RabbitMQ reads the CC and BCC headers as extra routing keys and
		// closes the channel when one is not an array.
		{name: "cc-header-not-array", hostile: []hostileDoc{simple("cc-string", wantFailed,
			[][]string{any1("CC")}, field(events.FieldHeaders, bson.D{{Key: "CC", Value: "audit"}}))}},
		{name: "bcc-header-not-array", hostile: []hostileDoc{simple("bcc-number", wantFailed,
			[][]string{any1("BCC")}, field(events.FieldHeaders, bson.D{{Key: "BCC", Value: 5}}))}},
		// An array of non-strings is ignored by RabbitMQ: harmless.
		{name: "cc-header-array-of-numbers", hostile: []hostileDoc{simple("cc-numbers", wantDeliveredOrFailed,
			[][]string{any1("CC")}, field(events.FieldHeaders, bson.D{{Key: "CC", Value: bson.A{1, 2}}}))}},

		// Headers RabbitMQ writes itself: an event must not forge them
		// (a consumer would read a forged x-delivery-count as the broker's).
		{name: "broker-owned-headers", hostile: []hostileDoc{
			simple("forged-delivery-count", wantFailed, [][]string{any1("headers.x-delivery-count"), any1("RabbitMQ sets itself")},
				field(events.FieldHeaders, bson.D{{Key: "x-delivery-count", Value: int64(99)}})),
			simple("forged-delivery-count-upper", wantFailed, [][]string{any1("headers.X-Delivery-Count")},
				field(events.FieldHeaders, bson.D{{Key: "X-Delivery-Count", Value: int32(0)}})),
			simple("forged-death", wantFailed, [][]string{any1("headers.x-death")},
				field(events.FieldHeaders, bson.D{{Key: "x-death", Value: bson.A{bson.D{{Key: "count", Value: int64(9)}}}}})),
			simple("forged-first-death", wantFailed, [][]string{any1("headers.x-first-death-reason")},
				field(events.FieldHeaders, bson.D{{Key: "tenant", Value: "acme"}, {Key: "x-first-death-reason", Value: "rejected"}})),
			simple("forged-received-from", wantFailed, [][]string{any1("headers.x-received-from")},
				field(events.FieldHeaders, bson.D{{Key: "x-received-from", Value: bson.A{}}})),
		}},

		// A document near MongoDB's 16 MiB limit: the worker's own fields
		// would push it over.
		{name: "document-near-16MiB", cfg: Config{MaxBodyBytes: MaxBodyBytesDefault},
			hostile: []hostileDoc{{
				doc:     func(t *testing.T, at time.Time) any { return sizedDoc(t, "near-16mib", at, maxDocumentBytes-300) },
				want:    wantFailed,
				mention: [][]string{any1(strconv.Itoa(maxDocumentBytes), "16 MiB", "16MiB")},
			}}},

		// Exactly the limit: FerretDB and MongoDB store it, but the claim's
		// own fields cannot be added to it.
		{name: "document-at-16MiB", cfg: Config{MaxBodyBytes: MaxBodyBytesDefault},
			hostile: []hostileDoc{{
				doc:     func(t *testing.T, at time.Time) any { return sizedDoc(t, "at-16mib", at, maxDocumentBytes) },
				want:    wantFailed,
				mention: [][]string{any1(strconv.Itoa(maxDocumentBytes), "16 MiB", "16MiB")},
			}}},

		// The poison classes NewMessage already knows.
		{name: "type-missing", hostile: []hostileDoc{simple("type-missing", wantFailed,
			[][]string{any1(`"type"`)}, field(events.FieldType, unsetValue))}},
		{name: "type-longer-than-255", hostile: []hostileDoc{simple("type-long", wantFailed,
			[][]string{any1(`"type"`), any1("255")}, field(events.FieldType, strings.Repeat("t", 256)))}},
		{name: "payload-not-document", hostile: []hostileDoc{simple("payload-array", wantFailed,
			[][]string{any1(`"payload"`)}, field(events.FieldPayload, bson.A{1, 2}))}},
		{name: "header-regex", hostile: []hostileDoc{simple("header-regex", wantFailed,
			[][]string{any1("headers.r")}, field(events.FieldHeaders, bson.D{{Key: "r", Value: bson.Regex{Pattern: "^a"}}}))}},
		{name: "header-too-deep", hostile: []hostileDoc{simple("header-deep", wantFailed,
			[][]string{any1("headers"), any1("16")}, field(events.FieldHeaders, deep))}},
		{name: "header-key-longer-than-255", hostile: []hostileDoc{simple("header-key-long", wantFailed,
			[][]string{any1("headers"), any1("255")}, field(events.FieldHeaders, bson.D{{Key: strings.Repeat("k", 256), Value: "v"}}))}},
		{name: "headers-string", hostile: []hostileDoc{simple("headers-string", wantFailed,
			[][]string{any1(`"headers"`)}, field(events.FieldHeaders, "tenant=acme"))}},
		{name: "createdAt-missing", hostile: []hostileDoc{simple("created-missing", wantFailed,
			[][]string{any1("createdAt")}, field(events.FieldCreatedAt, unsetValue))}},
		{name: "id-empty-string", hostile: []hostileDoc{{
			doc:     func(_ *testing.T, at time.Time) any { return eventDoc("", at) },
			want:    wantFailed,
			mention: [][]string{any1("_id")},
		}}},
		{name: "id-int", hostile: []hostileDoc{{
			doc:     func(_ *testing.T, at time.Time) any { return eventDoc(int32(12345), at) },
			want:    wantFailed,
			mention: [][]string{any1("_id")},
		}}},
		{name: "id-document", hostile: []hostileDoc{{
			doc: func(_ *testing.T, at time.Time) any {
				return eventDoc(bson.D{{Key: "tenant", Value: "a"}, {Key: "n", Value: 1}}, at)
			},
			want:    wantFailed,
			mention: [][]string{any1("_id")},
		}}},
		// An aggregate id is a header value (long string): a long one is fine.
		{name: "aggregateId-long", hostile: []hostileDoc{simple("aggregate-long", wantDeliveredOrFailed,
			[][]string{any1("aggregateId")}, field(events.FieldAggregateID, strings.Repeat("a", 1000)))}},
		// The aggregate's version: a value that is not a whole number of
		// 0 or more is poison naming the field; it orders nothing, so the
		// valid versions of its aggregate are not held behind it (with
		// the default wait they are held by the FAILED event, as behind
		// any poison one).
		{name: "sequence-negative", hostile: []hostileDoc{simple("sequence-negative", wantFailed,
			[][]string{any1(`"sequence"`), any1("0 or more"), any1("-3")},
			field(events.FieldAggregateID, "h"), field(events.FieldSequence, int64(-3)))}},
		{name: "sequence-not-a-number", hostile: []hostileDoc{simple("sequence-string", wantFailed,
			[][]string{any1(`"sequence"`), any1("got string")},
			field(events.FieldAggregateID, "h"), field(events.FieldSequence, "7"))}},
		{name: "sequence-fraction", hostile: []hostileDoc{simple("sequence-fraction", wantFailed,
			[][]string{any1(`"sequence"`), any1("double 2.5")},
			field(events.FieldAggregateID, "h"), field(events.FieldSequence, 2.5))}},
		// A repeat, and an aggregate that mixes events with and without a
		// sequence: counted, never held.
		{name: "sequence-repeat-and-mixed", hostile: []hostileDoc{
			simple("sequence-2", wantDeliveredOrFailed, nil, field(events.FieldAggregateID, "h"), field(events.FieldSequence, int64(2))),
			simple("sequence-2-again", wantDeliveredOrFailed, nil, field(events.FieldAggregateID, "h"), field(events.FieldSequence, int32(2))),
			simple("sequence-none", wantDeliveredOrFailed, nil, field(events.FieldAggregateID, "h")),
		}},
	}
}

// sizedDoc is a valid event document of exactly size bytes as BSON.
func sizedDoc(t *testing.T, id string, at time.Time, size int) bson.Raw {
	t.Helper()
	build := func(n int) bson.Raw {
		return testenv.Marshal(t, eventDoc(id, at, field(events.FieldPayload, bson.D{{Key: "blob", Value: strings.Repeat("x", n)}})))
	}
	base := len(build(0))
	raw := build(size - base)
	if len(raw) != size {
		t.Fatalf("sized document is %d bytes, want %d", len(raw), size)
	}
	return raw
}
