package mongo_test

// The claim on a sharded cluster (a config server, two shards and a
// mongos router, started with testcontainers-go), the outbox collection
// sharded on the stored partition first, as docs/scaling.md advises:
// which shards a claim's lane reads and its write reach, by explain, and
// fenced claims through the router, whose transactions take the fence on
// the database's primary shard and the events on theirs. It needs a
// Docker engine and skips, saying so, where there is none.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
)

// shardKey is the shard key docs/scaling.md advises, and shardMiddle the
// value that splits the partitions in two.
var (
	shardKey    = bson.D{{Key: events.FieldPartition, Value: 1}, {Key: events.FieldAggregateID, Value: 1}}
	shardMiddle = bson.D{{Key: events.FieldPartition, Value: int32(events.Partitions / 2)}, {Key: events.FieldAggregateID, Value: bson.MinKey{}}}
)

func TestContainerShardedClaim(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cluster := testenv.ShardedCluster(t)
	s := containerStore(t, cluster.Client)
	if !s.SupportsTransactions() || !mongo.SplitClaim(s) {
		t.Fatalf("through mongos: transactions %t, lane read by index %t; want both", s.SupportsTransactions(), mongo.SplitClaim(s))
	}
	coll := s.Collection()
	ns := coll.Database().Name() + "." + coll.Name()
	// Two chunks: the first, where the collection began, holds the events
	// without a stored partition (null sorts before every number) and
	// partitions 0 to 31; the second, on the other shard, 32 to 63.
	low, high := cluster.ShardTwoWays(t, ns, shardKey, shardMiddle)

	lowOwned, highOwned := partitionRange(0, 16), partitionRange(32, 48)
	lowAggs, highAggs := ownedAggregates("low", lowOwned, 100), ownedAggregates("high", highOwned, 100)
	var docs []bson.D
	for i, a := range slices.Concat(lowAggs, highAggs) {
		docs = append(docs, stampedLaneEvent(t, a, i))
	}
	insert(t, coll, docs...)

	t.Run("lane reads", func(t *testing.T) {
		both := []string{low, high}
		slices.Sort(both)
		for _, c := range []struct {
			name  string
			owned []bool
			want  []string
		}{
			{"partitions on the first shard", lowOwned, []string{low}},
			// The lane's $in names null too, for events a producer wrote
			// without a partition: they live in the first chunk, so a
			// claim of the other shard's partitions reads both shards.
			{"partitions on the other shard", highOwned, both},
		} {
			limit := events.ClaimLimit{Events: 50, Ordered: true, Owned: c.owned}
			explains, err := mongo.ExplainLane(ctx, s, base, limit)
			if err != nil {
				t.Fatalf("%s: explain: %v", c.name, err)
			}
			for i, ex := range explains {
				shards, plans := shardPlans(t, ex)
				if !slices.Equal(shards, c.want) {
					t.Errorf("%s: find %d reaches shards %v, want %v", c.name, i, shards, c.want)
				}
				for shard, plan := range plans {
					if !strings.Contains(plan, mongo.LaneIndex) {
						t.Errorf("%s: find %d on %s does not read %s: %s", c.name, i, shard, mongo.LaneIndex, plan)
					}
					// The events never retried, in index order, as on a
					// replica set (lane_container_test.go).
					if i == 0 && (!strings.Contains(plan, "SORT_MERGE") || strings.Contains(plan, `"SORT"`)) {
						t.Errorf("%s: find %d on %s is not a merge of index scans in order: %s", c.name, i, shard, plan)
					}
				}
			}
		}
	})

	t.Run("claim write", func(t *testing.T) {
		// It names the events by _id, not by partition: mongos sends it
		// to every shard (docs/scaling.md, The claim's write).
		ex, err := mongo.ExplainClaimWrite(ctx, s, lease("w"), []any{highAggs[0], highAggs[1]})
		if err != nil {
			t.Fatalf("explain: %v", err)
		}
		shards, _ := shardPlans(t, ex)
		all := slices.Sorted(slices.Values(cluster.Shards))
		if !slices.Equal(shards, all) {
			t.Errorf("the claim's write reaches shards %v, want every shard %v", shards, all)
		}
	})

	t.Run("fenced claims", func(t *testing.T) {
		// Events without a stored partition, as a producer that does not
		// use the helper writes them: in the first chunk, read by every
		// lane.
		var unstamped []string
		for i, a := range ownedAggregates("bare", highOwned, 20) {
			insert(t, coll, laneEvent(a, "order.created", a, 1000+i))
			unstamped = append(unstamped, a)
		}
		tenures := make([]int64, events.Partitions)
		for p, mine := range highOwned {
			if mine {
				tenures[p] = 1
			}
		}
		var got []string
		for n := range 5 {
			limit := events.ClaimLimit{Events: 50, Ordered: true, Owned: highOwned, Tenures: tenures}
			claimed := claimLane(t, s, fmt.Sprint("fenced-", n), limit)
			if len(claimed) == 0 {
				break
			}
			got = append(got, claimed...)
		}
		want := slices.Concat(highAggs, unstamped)
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("claims of the second shard's partitions took %d events, want its %d and the %d without a partition:\n got %v\nwant %v",
				len(got), len(highAggs), len(unstamped), got, want)
		}
		// A claim stores the partition of the events it reads without one
		// in one multi-document update; on a collection sharded on the
		// partition that update changes the shard key, which MongoDB
		// allows only one document at a time. Said, not asserted: the
		// relay delivers those events either way (above).
		n, err := coll.CountDocuments(ctx, bson.D{
			{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: unstamped}}},
			{Key: events.FieldPartition, Value: bson.D{{Key: "$ne", Value: nil}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("of %d events written without a partition, %d have one stored after their claims", len(unstamped), n)
	})
}

// partitionRange marks partitions from to below to as owned.
func partitionRange(from, to int) []bool {
	owned := make([]bool, events.Partitions)
	for p := from; p < to; p++ {
		owned[p] = true
	}
	return owned
}

// stampedLaneEvent is laneEvent of aggregate id, the n-th, with its
// partition stored, as the producer helper writes it.
func stampedLaneEvent(t *testing.T, id string, n int) bson.D {
	t.Helper()
	d := laneEvent(id, "order.created", id, n)
	return append(d, events.PartitionField(testenv.Marshal(t, d)))
}

// shardPlans reads an explain through mongos: the shards it names,
// sorted, and each one's winning plan.
func shardPlans(t *testing.T, ex bson.Raw) ([]string, map[string]string) {
	t.Helper()
	v, err := ex.LookupErr("queryPlanner", "winningPlan", "shards")
	if err != nil {
		t.Fatalf("explain without queryPlanner.winningPlan.shards (not through mongos?): %v\n%s", err, ex)
	}
	list, err := v.Array().Values()
	if err != nil {
		t.Fatalf("explain's shards: %v", err)
	}
	var names []string
	plans := map[string]string{}
	for _, shard := range list {
		name := shard.Document().Lookup("shardName").StringValue()
		names = append(names, name)
		plans[name] = shard.Document().Lookup("winningPlan").String()
	}
	slices.Sort(names)
	return names, plans
}
