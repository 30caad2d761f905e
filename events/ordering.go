package events

import (
	"cmp"
	"encoding/binary"
	"strings"

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
	typ, id, ok := aggregate(doc)
	if !ok {
		return "", false
	}
	var b strings.Builder
	b.Grow(len(typ) + 1 + len(id))
	b.Write(typ)
	b.WriteByte(0)
	b.Write(id)
	return b.String(), true
}

// aggregate returns the bytes of the two strings an ordering key is made
// of, in place: aggregateType (empty when it is not a string) and
// aggregateId, which must be a non-empty string.
func aggregate(doc bson.Raw) (typ, id []byte, ok bool) {
	id, ok = stringBytes(doc.Lookup(FieldAggregateID))
	if !ok || len(id) == 0 {
		return nil, nil, false
	}
	typ, _ = stringBytes(doc.Lookup(FieldAggregateType))
	return typ, id, true
}

// stringBytes returns the bytes of a string value in place, where
// StringValueOK would copy them into a new string.
func stringBytes(v bson.RawValue) ([]byte, bool) {
	if v.Type != bson.TypeString || len(v.Value) < 4 {
		return nil, false
	}
	n := int64(int32(binary.LittleEndian.Uint32(v.Value)))
	if n < 1 || n > int64(len(v.Value)-4) {
		return nil, false
	}
	return v.Value[4 : 4+n-1], true
}

// Key builds the ordering key of an aggregate, as OrderingKey does.
func Key(aggregateType, aggregateID string) string {
	return aggregateType + "\x00" + aggregateID
}

// Partition is the partition of an event: that of its ordering key, or
// for an event without one, that of its _id, so that unordered events
// spread over every partition.
func Partition(doc bson.Raw) int {
	if typ, id, ok := aggregate(doc); ok {
		// PartitionOf(OrderingKey(doc)), without building the key: a
		// claim works it out for every document it reads.
		return partition(fnv1a(fnv1a(fnv1a(fnvOffset, typ), []byte{0}), id))
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
	return partition(fnv1a(fnvOffset, []byte(key)))
}

// FNV-1a, 32 bits: the offset basis and the prime.
const (
	fnvOffset = 2166136261
	fnvPrime  = 16777619
)

// fnv1a goes on hashing b from the hash h.
func fnv1a(h uint32, b []byte) uint32 {
	for _, c := range b {
		h ^= uint32(c)
		h *= fnvPrime
	}
	return h
}

func partition(h uint32) int { return int(h % Partitions) }

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
