package mongo_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

func agg(id string) []bson.E {
	return []bson.E{field(events.FieldAggregateType, "order"), field(events.FieldAggregateID, id)}
}

// TestClaimOrdered: the ordered claim leaves out every aggregate that is
// held, breaks createdAt ties by _id, and keeps to the owned partitions;
// the single find (FerretDB) and the split finds (MongoDB) agree.
func TestClaimOrdered(t *testing.T) {
	t.Parallel()
	eachClaimStrategy(t, func(t *testing.T, s *mongo.Store, coll *driver.Collection) {
		at := ago(time.Hour)
		insert(t, coll,
			ev("p1", events.StatusProcessing, at, agg("in-flight")...),
			ev("p2", events.StatusNew, at.Add(time.Millisecond), agg("in-flight")...),
			ev("r1", events.StatusNew, at, append(agg("backing-off"), field(events.FieldRetryAt, base.Add(time.Hour)), field(events.FieldAttempts, 1))...),
			ev("r2", events.StatusNew, at.Add(time.Millisecond), agg("backing-off")...),
			ev("f1", events.StatusFailed, at, agg("failed")...),
			ev("f2", events.StatusNew, at.Add(time.Millisecond), agg("failed")...),
			ev("s1", events.StatusFailed, at, append(agg("skipped"), field(events.FieldSkippedAt, base), field(events.FieldSkippedBy, "alice"))...),
			ev("s2", events.StatusNew, at.Add(time.Millisecond), agg("skipped")...),
			ev("t-b", events.StatusNew, at.Add(2*time.Millisecond), agg("tie")...),
			ev("t-a", events.StatusNew, at.Add(2*time.Millisecond), agg("tie")...),
			ev("d1", events.StatusNew, at, append(agg("due-retry"), field(events.FieldRetryAt, base.Add(-time.Minute)), field(events.FieldAttempts, 1))...),
			ev("d2", events.StatusNew, at.Add(time.Millisecond), agg("due-retry")...),
			ev("u1", events.StatusNew, at.Add(3*time.Millisecond)),
		)
		claim := func(token string, limit events.ClaimLimit) []string {
			t.Helper()
			res, err := s.Claim(t.Context(), events.Lease{WorkerID: "w", Token: token, At: base}, limit)
			if err != nil {
				t.Fatalf("Claim: %v", err)
			}
			return ids(res.Claimed)
		}
		got := claim("t1", events.ClaimLimit{Events: 100, Ordered: true, FailedHolds: true})
		want := []string{"d1", "d2", "s2", "t-a", "t-b", "u1"} // claim order: createdAt, then _id
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("ordered claim (-want +got):\n%s", diff)
		}
		// continue: the FAILED event holds nothing.
		got = claim("t2", events.ClaimLimit{Events: 100, Ordered: true})
		if diff := cmp.Diff([]string{"f2"}, got); diff != "" {
			t.Errorf("claim under continue (-want +got):\n%s", diff)
		}
	})
}

func TestClaimOwnedPartitions(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	at := ago(time.Hour)
	var docs []bson.D
	byPartition := map[int][]string{}
	for i := range 40 {
		id := fmt.Sprintf("e%02d", i)
		a := fmt.Sprintf("agg-%d", i%10)
		docs = append(docs, ev(id, events.StatusNew, at.Add(time.Duration(i)*time.Millisecond), agg(a)...))
		p := events.PartitionOf(events.Key("order", a))
		byPartition[p] = append(byPartition[p], id)
	}
	insert(t, coll, docs...)
	owned := make([]bool, events.Partitions)
	var want []string
	for p, ids := range byPartition {
		if len(want) < 10 {
			owned[p] = true
			want = append(want, ids...)
		}
	}
	res, err := s.Claim(t.Context(), events.Lease{WorkerID: "w", Token: "t", At: base},
		events.ClaimLimit{Events: 100, Owned: owned, Ordered: true, FailedHolds: true})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, c := range res.Claimed {
		got[fmt.Sprint(c.ID)] = true
	}
	for _, id := range want {
		if !got[id] {
			t.Errorf("event %s of an owned partition not claimed", id)
		}
	}
	if len(got) != len(want) {
		t.Errorf("claimed %d events, want the %d of the owned partitions", len(got), len(want))
	}
	// Owning nothing claims nothing, and reads nothing.
	res, err = s.Claim(t.Context(), events.Lease{WorkerID: "w", Token: "t2", At: base},
		events.ClaimLimit{Events: 100, Owned: make([]bool, events.Partitions)})
	if err != nil || len(res.Claimed) != 0 {
		t.Errorf("Claim owning nothing = %d events, %v", len(res.Claimed), err)
	}
}

func TestHeldStats(t *testing.T) {
	t.Parallel()
	eachStatsStrategy(t, testHeldStats)
}

func testHeldStats(t *testing.T, s *mongo.Store, coll *driver.Collection) {
	at := ago(time.Hour)
	insert(t, coll,
		ev("p1", events.StatusProcessing, at, agg("in-flight")...),
		ev("p2", events.StatusNew, at.Add(time.Millisecond), agg("in-flight")...),
		ev("r1", events.StatusNew, at, append(agg("backing-off"), field(events.FieldRetryAt, base.Add(time.Hour)))...),
		ev("r2", events.StatusNew, at.Add(2*time.Millisecond), agg("backing-off")...),
		ev("f1", events.StatusFailed, at, agg("failed")...),
		ev("f2", events.StatusNew, at.Add(time.Millisecond), agg("failed")...),
		ev("s1", events.StatusFailed, at, append(agg("skipped"), field(events.FieldSkippedAt, base))...),
		ev("s2", events.StatusNew, at.Add(time.Millisecond), agg("skipped")...),
		ev("r3", events.StatusNew, at, append(agg("alone"), field(events.FieldRetryAt, base.Add(time.Hour)))...),
	)
	for _, tc := range []struct {
		failedHolds bool
		want        events.HeldStats
	}{
		{true, events.HeldStats{Aggregates: 2, OldestWaiting: at.Add(time.Millisecond)}},
		{false, events.HeldStats{Aggregates: 1, OldestWaiting: at.Add(2 * time.Millisecond)}},
	} {
		got, err := s.Held(t.Context(), base, tc.failedHolds)
		if err != nil {
			t.Fatal(err)
		}
		if got.Aggregates != tc.want.Aggregates || !got.OldestWaiting.Equal(tc.want.OldestWaiting) {
			t.Errorf("Held(failedHolds=%t) = %+v, want %+v", tc.failedHolds, got, tc.want)
		}
	}
}
