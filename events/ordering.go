package events

import (
	"cmp"
	"hash/fnv"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Partitions is the number of partitions events are spread over for
// sharing the work between replicas. It is a constant of the protocol, not
// a setting: every replica must put every event in the same partition, so
// changing it needs every replica stopped (docs/design.md).
const Partitions = 64

// OrderingKey returns the key that orders an event among its aggregate's:
// aggregateType, a zero byte, and aggregateId, when aggregateId is a
// non-empty string. ok is false for an event without one; such an event
// is not ordered against any other. The producer writes nothing new for
// it: both fields are part of the message contract.
func OrderingKey(doc bson.Raw) (key string, ok bool) {
	id, ok := doc.Lookup(FieldAggregateID).StringValueOK()
	if !ok || id == "" {
		return "", false
	}
	typ, _ := doc.Lookup(FieldAggregateType).StringValueOK()
	return typ + "\x00" + id, true
}

// Key builds the ordering key of an aggregate, as OrderingKey does.
func Key(aggregateType, aggregateID string) string {
	return aggregateType + "\x00" + aggregateID
}

// Partition is the partition of an event: that of its ordering key, or
// for an event without one, that of its _id, so that unordered events
// spread over every partition.
func Partition(doc bson.Raw) int {
	if key, ok := OrderingKey(doc); ok {
		return PartitionOf(key)
	}
	v, err := doc.LookupErr(FieldID)
	if err != nil {
		return 0
	}
	switch v.Type {
	case bson.TypeObjectID:
		return PartitionOf(v.ObjectID().Hex())
	case bson.TypeString:
		return PartitionOf(v.StringValue())
	default:
		return PartitionOf(string(v.Value))
	}
}

// PartitionOf hashes a key to its partition: FNV-1a (32 bits) modulo
// Partitions, the same on every platform and in every language.
func PartitionOf(key string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % Partitions)
}

// CompareOrder orders two event documents as the claim sorts them:
// createdAt first, then _id, the documented tiebreak for events of one
// aggregate created in the same millisecond. It returns -1, 0 or +1. It
// follows MongoDB's sort order for the types a producer writes (a date
// createdAt; an ObjectID or string _id) and ranks other types only
// roughly, which can change only the order of such events.
func CompareOrder(a, b bson.Raw) int {
	ra, ta := createdRank(a)
	rb, tb := createdRank(b)
	switch {
	case ra != rb:
		return cmp.Compare(ra, rb)
	case ta != tb:
		return cmp.Compare(ta, tb)
	}
	return compareIDs(a.Lookup(FieldID), b.Lookup(FieldID))
}

// createdRank places a createdAt in MongoDB's sort order: missing or null
// first, then the types that sort before dates, then dates by time, then
// the rest.
func createdRank(doc bson.Raw) (rank int, at int64) {
	v, err := doc.LookupErr(FieldCreatedAt)
	if err != nil {
		return 0, 0
	}
	switch v.Type {
	case bson.TypeNull, bson.TypeUndefined, bson.TypeMinKey:
		return 0, 0
	case bson.TypeDateTime:
		ms, _ := v.DateTimeOK()
		return 2, ms
	case bson.TypeTimestamp, bson.TypeRegex, bson.TypeMaxKey:
		return 3, 0
	default:
		return 1, 0
	}
}

// compareIDs orders two _id values: strings before ObjectIDs (as MongoDB
// sorts them), strings by their bytes (the simple collation), ObjectIDs by
// their bytes (creation second first).
func compareIDs(a, b bson.RawValue) int {
	ra, rb := idRank(a.Type), idRank(b.Type)
	if ra != rb {
		return cmp.Compare(ra, rb)
	}
	switch a.Type {
	case bson.TypeString:
		return cmp.Compare(a.StringValue(), b.StringValue())
	default:
		return cmp.Compare(string(a.Value), string(b.Value))
	}
}

func idRank(t bson.Type) int {
	switch t {
	case bson.TypeString:
		return 1
	case bson.TypeObjectID:
		return 2
	case 0:
		return 3
	default:
		return 10 + int(t)
	}
}
