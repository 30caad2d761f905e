package events

import (
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// The fields that put a NEW event in a claim's lane: the claim reads by
// equality on them, so that the database, not the worker, leaves out what
// a replica may not take (docs/design.md, The claim's lane).
const (
	// FieldPartition is the event's partition (Partition), an int32
	// stored once: by the producer helper (Draft.Document) or, for an
	// event written without it, by the first claim that reads it.
	FieldPartition = "partition"
	// FieldParked is true on a NEW event that waits, out of every claim's
	// lane: its type is paused, or a FAILED event holds its aggregate.
	// FieldParkedFor says which (ParkedPaused, ParkedHeld). The claim that
	// meets such an event parks it; the recovery job's sweep, and a
	// resume, unpark it once the reason is gone.
	FieldParked    = "parked"
	FieldParkedFor = "parkedFor"
)

// Why a NEW event is parked (FieldParkedFor).
const (
	ParkedPaused = "paused" // its type is paused
	ParkedHeld   = "held"   // a FAILED event holds its aggregate
)

// StoredPartition reads an event's stored partition. ok is false where
// there is none (absent or null), and err names the fault of a value the
// claim must not trust: not a whole number, out of range, or not the
// partition the event's key hashes to. Such an event is not claimed by the
// lane its value names but failed with err, since another replica may
// hold the events of the same aggregate (never a silent reorder).
func StoredPartition(doc bson.Raw) (p int, ok bool, err error) {
	v, lerr := doc.LookupErr(FieldPartition)
	if lerr != nil || v.Type == bson.TypeNull {
		return 0, false, nil
	}
	n, isInt := v.AsInt64OK()
	if !isInt || (v.Type != bson.TypeInt32 && v.Type != bson.TypeInt64) {
		return 0, false, invalid(FieldPartition, "must be a whole number (int32), got %s; the worker manages this field", typeName(v.Type))
	}
	if want := Partition(doc); n != int64(want) {
		return 0, false, invalid(FieldPartition, "is %d, but the event's key hashes to partition %d; the worker manages this field", n, want)
	}
	return int(n), true, nil
}

// partitionValue is the stored form of partition p.
func partitionValue(p int) int32 { return int32(p) }

// PartitionField is the field that stores doc's partition, for a write.
func PartitionField(doc bson.Raw) bson.E {
	return bson.E{Key: FieldPartition, Value: partitionValue(Partition(doc))}
}

// draftPartition is the partition of a new event with _id id, as
// Partition works it out from the stored document.
func draftPartition(id any, aggregateType, aggregateID string) int {
	if aggregateID != "" {
		return PartitionOf(Key(aggregateType, aggregateID))
	}
	switch v := id.(type) {
	case bson.ObjectID:
		return PartitionOf(v.Hex())
	default:
		return PartitionOf(fmt.Sprint(v))
	}
}
