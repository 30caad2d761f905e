package mongo

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
)

// tenuresOf returns a Tenures slice with the given partitions' tenures.
func tenuresOf(m map[int]int64) []int64 {
	out := make([]int64, events.Partitions)
	for p, t := range m {
		out[p] = t
	}
	return out
}

// A read raises each fence once per tenure, leaves out a partition whose
// fence refused the tenure it holds, and tries again under a new tenure.
func TestFencePlan(t *testing.T) {
	t.Parallel()
	var f fences
	f.raised[1], f.refused[2], f.raised[3], f.refused[4] = 5, 6, 7, 8
	owned := make([]bool, events.Partitions)
	for _, p := range []int{0, 1, 2, 3, 4} {
		owned[p] = true
	}
	tenures := tenuresOf(map[int]int64{
		0: 1,  // never raised
		1: 5,  // raised under this tenure: nothing to do
		2: 6,  // refused under this tenure: left out
		3: 9,  // raised under an earlier tenure: raise again
		4: 10, // refused under an earlier tenure, taken again since: raise
		5: 3,  // a tenure but not owned by this read
	})
	raise, refused := f.plan(tenures, owned)
	if diff := cmp.Diff([]int{0, 3, 4}, raise); diff != "" {
		t.Errorf("raise (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{2}, refused); diff != "" {
		t.Errorf("refused (-want +got):\n%s", diff)
	}
	// owned nil: every partition with a tenure.
	raise, _ = f.plan(tenures, nil)
	if diff := cmp.Diff([]int{0, 3, 4, 5}, raise); diff != "" {
		t.Errorf("raise with owned nil (-want +got):\n%s", diff)
	}
}

// What the fences answered is recorded: a fence at the tenure is raised, a
// fence past it refuses that tenure (and is returned with the fence's
// tenure, for the ownership to number its next term above), a missing one
// neither.
func TestFenceNote(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		cur         map[int]int64
		wantRefused map[int]int64
		wantRaised  map[int]int64
		wantRefuse  map[int]int64
	}{
		{name: "all matched", cur: nil, wantRaised: map[int]int64{1: 4, 2: 4}},
		{name: "one held by a later tenure", cur: map[int]int64{1: 4, 2: 9},
			wantRefused: map[int]int64{2: 9}, wantRaised: map[int]int64{1: 4}, wantRefuse: map[int]int64{2: 4}},
		{name: "one missing", cur: map[int]int64{1: 4}, wantRaised: map[int]int64{1: 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var f fences
			got := f.note([]int{1, 2}, tenuresOf(map[int]int64{1: 4, 2: 4}), tc.cur)
			if diff := cmp.Diff(tc.wantRefused, got); diff != "" {
				t.Errorf("refused (-want +got):\n%s", diff)
			}
			for p := range events.Partitions {
				if f.raised[p] != tc.wantRaised[p] || f.refused[p] != tc.wantRefuse[p] {
					t.Errorf("partition %d: raised %d refused %d, want %d and %d", p, f.raised[p], f.refused[p], tc.wantRaised[p], tc.wantRefuse[p])
				}
			}
		})
	}
}

// A fence write matches while no later tenure has written, raises the
// fence, and always changes the document, so that it conflicts inside a
// transaction with any other write of it.
func TestFenceModel(t *testing.T) {
	t.Parallel()
	m := fenceModel(7, 42)
	want := bson.D{
		{Key: "_id", Value: "fence/7"},
		{Key: "tenure", Value: bson.D{{Key: "$lte", Value: int64(42)}}},
	}
	if diff := cmp.Diff(want, m.Filter); diff != "" {
		t.Errorf("filter (-want +got):\n%s", diff)
	}
	wantUpdate := bson.D{
		{Key: "$set", Value: bson.D{{Key: "tenure", Value: int64(42)}}},
		{Key: "$inc", Value: bson.D{{Key: "writes", Value: int64(1)}}},
	}
	if diff := cmp.Diff(wantUpdate, m.Update); diff != "" {
		t.Errorf("update (-want +got):\n%s", diff)
	}
	if m.Upsert != nil && *m.Upsert {
		t.Error("the fence write upserts: a stale owner could recreate a deleted fence at its own tenure")
	}
}

// A claim's partitions come once each, ascending: every fenced write
// takes the fences in the same order.
func TestClaimPartitions(t *testing.T) {
	t.Parallel()
	var docs []events.Claimed
	want := map[int]bool{}
	for i := range 40 {
		doc, err := bson.Marshal(bson.D{{Key: "_id", Value: i}, {Key: events.FieldAggregateType, Value: "order"},
			{Key: events.FieldAggregateID, Value: string(rune('a' + i%7))}})
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, events.Claimed{Doc: doc})
		want[events.Partition(doc)] = true
	}
	got := claimPartitions(docs)
	if len(got) != len(want) {
		t.Fatalf("claimPartitions = %v, want the %d distinct partitions", got, len(want))
	}
	for i, p := range got {
		if !want[p] || (i > 0 && got[i-1] >= p) {
			t.Fatalf("claimPartitions = %v: not each partition once, ascending", got)
		}
	}
}
