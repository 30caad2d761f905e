package mongo_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

// stamped is d with its partition stored, as events.Insert writes it.
func stamped(d bson.D) bson.D {
	return append(d, bson.E{Key: events.FieldPartition, Value: int32(events.Partition(toRaw(d)))})
}

func toRaw(d bson.D) bson.Raw {
	b, err := bson.Marshal(d)
	if err != nil {
		panic(err)
	}
	return b
}

// TestLargeLaneIsReadByPartition: on FerretDB a claim reads its lane one
// owned partition at a time once a whole read has timed out. Behind a paused head over every
// partition it claims its healthy events, parks the paused events of the
// partitions it read and only those; once the lane is small it reads it
// whole again. On MongoDB (split) the lane is read as before, and the
// claims agree.
func TestLargeLaneIsReadByPartition(t *testing.T) {
	t.Parallel()
	eachClaimStrategy(t, func(t *testing.T, s *mongo.Store, coll *driver.Collection) {
		owned := quarter()
		ownPaused, want := pausedLane(t, s, coll, 600, owned, stamped)
		mongo.ReadByPartition(s) // as after a whole read that timed out
		limit := events.ClaimLimit{Events: 10, Ordered: true, FailedHolds: true, Owned: owned}
		got := claimLane(t, s, "t1", limit)
		slices.Sort(want)
		slices.Sort(got)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("first claim behind the paused head (-want +got):\n%s", diff)
		}
		for i := range 3 {
			if got := claimLane(t, s, fmt.Sprint("t", i+2), limit); len(got) != 0 {
				t.Errorf("claim %d took %v, want nothing (all paused)", i+2, got)
			}
		}
		if diff := cmp.Diff(map[string]int{events.ParkedPaused: ownPaused}, parkedFor(t, coll)); diff != "" {
			t.Errorf("parked (-want +got):\n%s", diff)
		}
		if mongo.ReadsByPartition(s) {
			t.Errorf("the claims still read by partition once their lane held nothing")
		}
	})
}

// TestEventsOutsideEveryPartitionAreClaimed: an event written without a
// partition, beside events written with one, is claimed in its
// aggregate's order, first; an event whose stored partition is not a
// lane's is failed, not left NEW for good.
func TestEventsOutsideEveryPartitionAreClaimed(t *testing.T) {
	t.Parallel()
	eachClaimStrategy(t, func(t *testing.T, s *mongo.Store, coll *driver.Collection) {
		var docs []bson.D
		for i := range 200 {
			id := fmt.Sprintf("s%d", i)
			docs = append(docs, stamped(laneEvent(id, "order.created", id, 100+i)))
		}
		docs = append(docs,
			laneEvent("x1", "order.created", "x", 0), // no partition
			stamped(laneEvent("x2", "order.paid", "x", 1)),
			append(laneEvent("far", "order.created", "far", 2), bson.E{Key: events.FieldPartition, Value: int32(99)}),
		)
		insert(t, coll, docs...)
		mongo.ReadByPartition(s)
		var claimed []string
		for i := range 40 {
			got := claimLane(t, s, fmt.Sprint("t", i), events.ClaimLimit{Events: 10, Ordered: true, FailedHolds: true})
			if len(got) == 0 {
				break
			}
			claimed = append(claimed, got...)
		}
		if len(claimed) != 202 {
			t.Errorf("claimed %d events, want 202", len(claimed))
		}
		x1, x2 := -1, -1
		for i, id := range claimed {
			switch id {
			case "x1":
				x1 = i
			case "x2":
				x2 = i
			}
		}
		if x1 < 0 || x2 < 0 || x1 > x2 {
			t.Errorf("x1 claimed at %d, x2 at %d; want both, x1 first", x1, x2)
		}
		if e := get(t, coll, "far"); e.Status != events.StatusFailed {
			t.Errorf("far, stored in partition 99: %s, want FAILED", e.Status)
		}
	})
}

// TestSharedLaneIsReadByPartitionWhenDeep: on FerretDB a whole read of a
// lane other replicas share decodes their events too; once one fills its
// window (batch and read-ahead), the claims read by partition, and go on
// so while a partition or two fill a batch. A lane whose partitions are
// too shallow for that is read whole again, for a while; so is the lane
// of a replica that owns every partition, or one a whole read empties.
func TestSharedLaneIsReadByPartitionWhenDeep(t *testing.T) {
	t.Parallel()
	all := make([]bool, events.Partitions)
	for p := range all {
		all[p] = true
	}
	threeQuarters := make([]bool, events.Partitions)
	for p := range events.Partitions * 3 / 4 {
		threeQuarters[p] = true
	}
	// A batch of 10, a read-ahead of 80 of the owned partitions' events:
	// 90 of them fill a whole read, which reads up to 90 documents times
	// the replicas sharing the lane (at most 4) to find them.
	for _, c := range []struct {
		name   string
		owned  []bool
		events int
		// byPartition is whether the claims read by partition after each
		// claim: the first a whole read.
		byPartition []bool
	}{
		{"a quarter, about 25 a partition", quarter(), 1600, []bool{true, true, true}},
		// The third claim's whole read fills its window again, but the
		// claims stay with whole reads for a while.
		{"three quarters, about 3 a partition", threeQuarters, 160, []bool{true, false, false}},
		{"a quarter, the outbox less than a window", quarter(), 60, []bool{false}},
		{"every partition", all, 1600, []bool{false, false}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s, coll := setup(t)
			mongo.SetSplitClaim(s, false)
			var docs []bson.D
			for i := range c.events {
				docs = append(docs, stamped(laneEvent(fmt.Sprint("e", i), "t", fmt.Sprint("a", i), i)))
			}
			insert(t, coll, docs...)
			limit := events.ClaimLimit{Events: 10, Ordered: true, FailedHolds: true, Owned: c.owned}
			for i, want := range c.byPartition {
				if got := claimLane(t, s, fmt.Sprint("t", i), limit); len(got) == 0 {
					t.Fatalf("claim %d took nothing", i+1)
				}
				if got := mongo.ReadsByPartition(s); got != want {
					t.Errorf("after claim %d, reads by partition = %v, want %v", i+1, got, want)
				}
			}
		})
	}
}
