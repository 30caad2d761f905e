package events

import (
	"slices"
	"testing"
)

// BenchmarkPartition is the partition of an event with an aggregate,
// which a claim works out for every document it reads.
func BenchmarkPartition(b *testing.B) {
	doc := benchEvent(b, 1)
	b.ReportAllocs()
	for b.Loop() {
		Partition(doc)
	}
}

func BenchmarkOrderingKey(b *testing.B) {
	doc := benchEvent(b, 1)
	b.ReportAllocs()
	for b.Loop() {
		OrderingKey(doc)
	}
}

// BenchmarkSortBatch sorts a batch of 500 events by CompareOrder, as the
// claimer does: in the order the claim read them, which is mostly that
// order already, and each thousand created in the same millisecond (as
// the bench inserts them), so that the _id decides.
func BenchmarkSortBatch(b *testing.B) {
	batch := make([][]byte, 500)
	for i := range batch {
		batch[i] = benchEvent(b, i)
	}
	work := make([][]byte, len(batch))
	b.ReportAllocs()
	for b.Loop() {
		copy(work, batch)
		slices.SortStableFunc(work, func(a, c []byte) int { return CompareOrder(a, c) })
	}
}
