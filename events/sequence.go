package events

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// FieldSequence is the producer's optional version of the event's
// aggregate after the change: where the events of an aggregate carry it,
// they are published in its order whatever their createdAt
// (docs/ordering.md, The sequence field).
const FieldSequence = "sequence"

// HeaderSequence is the message header that carries an event's sequence
// (an AMQP signed 64-bit integer), beside x-aggregate-type and
// x-aggregate-id, so that consumers can check the order themselves.
const HeaderSequence = "x-aggregate-sequence"

// What a claim counts of the sequences it meets (outbox_sequence_anomalies_total):
// none of them holds an event back but SequenceWaiting, which waits for
// an earlier version.
const (
	// SequenceBehind is an event whose sequence is lower than one of its
	// aggregate already published: it is published, late.
	SequenceBehind = "behind"
	// SequenceRepeat is an event whose sequence another event of its
	// aggregate has, published or in its batch: both are published, in
	// createdAt order.
	SequenceRepeat = "repeat"
	// SequenceMixed is an aggregate whose batch has events with and
	// without a (valid) sequence: those without keep their createdAt place.
	SequenceMixed = "mixed"
	// SequenceWaiting is an event a claim left NEW because an earlier
	// version of its aggregate cannot be claimed with it (backing off,
	// parked, or past the claim's bounds).
	SequenceWaiting = "waiting"
	// SequenceReordered is an event a claim puts after an event of its
	// aggregate with a later createdAt, by their sequences: the
	// producers' clocks disagreed with the versions.
	SequenceReordered = "reordered"
)

// ceSequence is the CloudEvents sequence extension's attribute: a string
// whose lexicographic order is the events' order (sequenceString).
const ceSequence = "sequence"

// maxExactDouble bounds the doubles that hold every whole number exactly:
// mongosh and JavaScript producers write numbers as doubles.
const maxExactDouble = 1 << 53

// Sequence reads an event's sequence: ok is false when the event has none
// (missing or null). A sequence must be a whole number of 0 or more, as a
// 32- or 64-bit integer or a double without a fraction (up to 2^53);
// anything else is an *InvalidError naming the field, and the event is
// poison. Sequence never panics, whatever doc holds.
func Sequence(doc bson.Raw) (n int64, ok bool, err error) {
	v, lerr := doc.LookupErr(FieldSequence)
	if lerr != nil || v.Type == bson.TypeNull {
		return 0, false, nil
	}
	const want = "must be a whole number of 0 or more (the aggregate's version), got %s"
	switch v.Type {
	case bson.TypeInt32, bson.TypeInt64:
		n, ok := v.AsInt64OK()
		if !ok {
			return 0, false, malformed(FieldSequence, v)
		}
		if n < 0 {
			return 0, false, invalid(FieldSequence, want, strconv.FormatInt(n, 10))
		}
		return n, true, nil
	case bson.TypeDouble:
		f, ok := v.DoubleOK()
		if !ok {
			return 0, false, malformed(FieldSequence, v)
		}
		if math.IsNaN(f) || f < 0 || f != math.Trunc(f) || f > maxExactDouble {
			return 0, false, invalid(FieldSequence, want, fmt.Sprintf("double %v", f))
		}
		return int64(f), true, nil
	default:
		return 0, false, invalid(FieldSequence, want, typeName(v.Type))
	}
}

// ValidSequence is Sequence without its error: ok only for an event
// whose sequence is valid. An event with an invalid one is ordered as if
// it had none, and fails when it becomes a message.
func ValidSequence(doc bson.Raw) (int64, bool) {
	n, ok, err := Sequence(doc)
	return n, ok && err == nil
}

// sequenceString is the CloudEvents sequence attribute of n: the
// extension asks for a lexicographically orderable string, so n is
// written with 19 digits, as many as the largest int64 has, zero-padded.
func sequenceString(n int64) string { return fmt.Sprintf("%019d", n) }

// CompareInKey orders two events of one aggregate: by sequence when both
// carry a valid one, else as CompareOrder does (createdAt, then _id).
// Equal sequences fall back to CompareOrder too.
func CompareInKey(a, b bson.Raw) int {
	sa, oka := ValidSequence(a)
	sb, okb := ValidSequence(b)
	if oka && okb && sa != sb {
		return cmp.Compare(sa, sb)
	}
	return CompareOrder(a, b)
}

// SortBySequence puts the events of each aggregate that carry a valid
// sequence in its order, in the places those events hold in items:
// items, in claim order (CompareOrder), keep every other event where it
// is, so that an event without a sequence keeps its createdAt place
// among its aggregate's. Events with equal sequences keep their claim
// order. doc returns an item's document.
func SortBySequence[T any](items []T, doc func(T) bson.Raw) {
	slots := map[string][]int{}
	var keys []string
	for i, it := range items {
		d := doc(it)
		if _, ok := ValidSequence(d); !ok {
			continue
		}
		key, ok := OrderingKey(d)
		if !ok {
			continue
		}
		if _, seen := slots[key]; !seen {
			keys = append(keys, key)
		}
		slots[key] = append(slots[key], i)
	}
	for _, key := range keys {
		idx := slots[key]
		if len(idx) < 2 {
			continue
		}
		group := make([]T, len(idx))
		for j, i := range idx {
			group[j] = items[i]
		}
		slices.SortStableFunc(group, func(a, b T) int {
			sa, _ := ValidSequence(doc(a))
			sb, _ := ValidSequence(doc(b))
			return cmp.Compare(sa, sb)
		})
		for j, i := range idx {
			items[i] = group[j]
		}
	}
}
