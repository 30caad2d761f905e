package events

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestOrderingKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		doc     bson.D
		want    string
		ordered bool
	}{
		{"both", bson.D{{Key: FieldAggregateType, Value: "order"}, {Key: FieldAggregateID, Value: "42"}}, "order\x0042", true},
		{"id only", bson.D{{Key: FieldAggregateID, Value: "42"}}, "\x0042", true},
		{"type only", bson.D{{Key: FieldAggregateType, Value: "order"}}, "", false},
		{"empty id", bson.D{{Key: FieldAggregateType, Value: "order"}, {Key: FieldAggregateID, Value: ""}}, "", false},
		{"id not a string", bson.D{{Key: FieldAggregateID, Value: 42}}, "", false},
		{"null id", bson.D{{Key: FieldAggregateID, Value: nil}}, "", false},
		{"type not a string", bson.D{{Key: FieldAggregateType, Value: 1}, {Key: FieldAggregateID, Value: "42"}}, "\x0042", true},
	} {
		got, ok := OrderingKey(marshal(t, tc.doc))
		if got != tc.want || ok != tc.ordered {
			t.Errorf("%s: OrderingKey = %q, %t; want %q, %t", tc.name, got, ok, tc.want, tc.ordered)
		}
	}
	// The type takes part: the same id of two types is two aggregates.
	if Key("order", "1") == Key("invoice", "1") {
		t.Error("keys of different aggregates collide")
	}
}

func TestPartition(t *testing.T) {
	t.Parallel()
	// Known values pin the hash: a change would split aggregates between
	// replicas of two versions during a rolling upgrade.
	// FNV-1a of the empty string is 0x811c9dc5.
	if got := PartitionOf(""); got != int(uint32(0x811c9dc5)%Partitions) {
		t.Errorf("PartitionOf(\"\") = %d, want %d", got, uint32(0x811c9dc5)%Partitions)
	}
	a := marshal(t, bson.D{{Key: FieldID, Value: "e1"}, {Key: FieldAggregateType, Value: "order"}, {Key: FieldAggregateID, Value: "42"}})
	b := marshal(t, bson.D{{Key: FieldID, Value: "e2"}, {Key: FieldAggregateType, Value: "order"}, {Key: FieldAggregateID, Value: "42"}})
	if Partition(a) != Partition(b) || Partition(a) != PartitionOf("order\x0042") {
		t.Errorf("events of one aggregate in partitions %d and %d", Partition(a), Partition(b))
	}
	// Unordered events spread by _id.
	seen := map[int]bool{}
	for i := range 1000 {
		seen[Partition(marshal(t, bson.D{{Key: FieldID, Value: bson.NewObjectID()}, {Key: "n", Value: i}}))] = true
	}
	if len(seen) < Partitions*3/4 {
		t.Errorf("1000 unordered events fell in %d of %d partitions", len(seen), Partitions)
	}
}

func TestCompareOrder(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	doc := func(id any, at time.Time) bson.Raw {
		return marshal(t, bson.D{{Key: FieldID, Value: id}, {Key: FieldCreatedAt, Value: at}})
	}
	o1, o2 := bson.NewObjectIDFromTimestamp(t0), bson.NewObjectIDFromTimestamp(t0.Add(time.Second))
	for _, tc := range []struct {
		name string
		a, b bson.Raw
		want int
	}{
		{"earlier createdAt first", doc("b", t0), doc("a", t0.Add(time.Millisecond)), -1},
		{"same createdAt: _id decides", doc("a", t0), doc("b", t0), -1},
		{"same createdAt: ObjectIDs by bytes", doc(o2, t0), doc(o1, t0), 1},
		{"same createdAt: string before ObjectID", doc("z", t0), doc(o1, t0), -1},
		{"equal", doc("a", t0), doc("a", t0), 0},
	} {
		if got := CompareOrder(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: CompareOrder = %d, want %d", tc.name, got, tc.want)
		}
		if got := CompareOrder(tc.b, tc.a); got != -tc.want {
			t.Errorf("%s (swapped): CompareOrder = %d, want %d", tc.name, got, -tc.want)
		}
	}
}

func TestHeld(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		status      Status
		retryAt     time.Time
		skipped     bool
		failedHolds bool
		want        bool
	}{
		{StatusProcessing, time.Time{}, false, false, true},
		{StatusNew, time.Time{}, false, true, false},
		{StatusNew, now.Add(time.Second), false, false, true},
		{StatusNew, now, false, false, false},
		{StatusFailed, time.Time{}, false, true, true},
		{StatusFailed, time.Time{}, true, true, false},
		{StatusFailed, time.Time{}, false, false, false},
		{StatusPublished, time.Time{}, false, true, false},
	} {
		if got := Held(tc.status, tc.retryAt, tc.skipped, now, tc.failedHolds); got != tc.want {
			t.Errorf("Held(%s, retryAt %s, skipped %t, failedHolds %t) = %t, want %t",
				tc.status, tc.retryAt, tc.skipped, tc.failedHolds, got, tc.want)
		}
	}
}

// TestPartitionIsThatOfTheKey checks that Partition, which hashes the key
// in place, puts every ordered event where PartitionOf puts its key.
func TestPartitionIsThatOfTheKey(t *testing.T) {
	t.Parallel()
	for _, d := range []bson.D{
		{{Key: FieldAggregateType, Value: "order"}, {Key: FieldAggregateID, Value: "42"}},
		{{Key: FieldAggregateID, Value: "42"}},
		{{Key: FieldAggregateType, Value: 7}, {Key: FieldAggregateID, Value: "42"}},
		{{Key: FieldAggregateType, Value: "日本"}, {Key: FieldAggregateID, Value: "\x00x"}},
		{{Key: FieldAggregateID, Value: "order-00000001"}, {Key: FieldAggregateType, Value: "order"}},
	} {
		doc := marshal(t, d)
		key, ok := OrderingKey(doc)
		if !ok {
			t.Fatalf("%v: no ordering key", d)
		}
		if got, want := Partition(doc), PartitionOf(key); got != want {
			t.Errorf("%v: Partition = %d, PartitionOf(%q) = %d", d, got, key, want)
		}
	}
}
