package mongo_test

// The claim's lane on a real MongoDB (a single-node replica set, started
// with testcontainers-go): what a claim's read examines, by explain, when
// what stands at the head is another replica's, of a paused type, or
// held behind FAILED events; and the partitions a claim stores on events
// written without one (a pipeline update FerretDB does not have). It
// needs a Docker engine and skips, saying so, where there is none.

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
)

// containerStore is a prepared store on a database of its own on client.
func containerStore(t *testing.T, client *driver.Client) *mongo.Store {
	t.Helper()
	db := client.Database(testenv.UniqueName(t, "lane_"))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 30*time.Second)
		defer cancel()
		_ = db.Drop(ctx)
	})
	s := mongo.New(client, mongo.Config{Database: db.Name(), Logger: slog.New(slog.DiscardHandler)})
	if err := s.Prepare(t.Context()); err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	return s
}

// TestContainerLaneExaminesWhatItReturns: one of four replicas, behind a
// head of 20,000 events of other replicas' partitions, 20,000 of a paused
// type and 2,000 aggregates held by FAILED events with 5 events waiting
// each: once its first claim has parked its share, the finds of its next
// claim examine no more index keys and documents than a small multiple of
// what they return, the never-retried events merged in order from the
// index (SORT_MERGE, no blocking SORT).
func TestContainerLaneExaminesWhatItReturns(t *testing.T) {
	t.Parallel()
	client := testenv.ReplicaSet(t)
	s := containerStore(t, client)
	owned := quarter()
	var docs []bson.D
	add := func(id, typ, aggregate string, status events.Status) {
		d := laneEvent(id, typ, aggregate, len(docs))
		d[3].Value = status
		if status == events.StatusNew && len(docs)%2 == 0 {
			// half as the producer helper writes them, half without a
			// partition, which the first claim stores
			raw, _ := bson.Marshal(d)
			d = append(d, events.PartitionField(raw))
		}
		docs = append(docs, d)
	}
	for i := 0; len(docs) < 20000; i++ {
		if a := fmt.Sprint("other", i); !owned[events.PartitionOf(events.Key("order", a))] {
			add(a, "order.created", a, events.StatusNew)
		}
	}
	for i := range 20000 {
		add(fmt.Sprint("bulk", i), "bulk.import", fmt.Sprint("bulk", i), events.StatusNew)
	}
	for i := range 2000 {
		a := fmt.Sprint("held", i)
		add(a+"-0", "order.created", a, events.StatusFailed)
		for j := 1; j <= 5; j++ {
			add(fmt.Sprintf("%s-%d", a, j), "order.created", a, events.StatusNew)
		}
	}
	for _, a := range ownedAggregates("mine", owned, 2000) {
		add(a, "order.created", a, events.StatusNew)
	}
	for chunk := range slices.Chunk(docs, 5000) {
		insert(t, s.Collection(), chunk...)
	}
	pause(t, s, "bulk.import")
	limit := events.ClaimLimit{Events: 500, Ordered: true, FailedHolds: true, Owned: owned}
	first := claimLane(t, s, "t1", limit)
	if len(first) != 500 || !strings.HasPrefix(first[0], "mine") {
		t.Fatalf("first claim took %d events starting %v, want 500 of this replica's healthy ones", len(first), first[:min(len(first), 1)])
	}
	explains, err := mongo.ExplainLane(t.Context(), s, base, limit)
	if err != nil {
		t.Fatal(err)
	}
	for i, ex := range explains {
		stats := ex.Lookup("executionStats")
		returned := stats.Document().Lookup("nReturned").AsInt64()
		keys := stats.Document().Lookup("totalKeysExamined").AsInt64()
		examined := stats.Document().Lookup("totalDocsExamined").AsInt64()
		plan := ex.Lookup("queryPlanner", "winningPlan").String()
		t.Logf("find %d: returned %d, keys examined %d, documents examined %d", i, returned, keys, examined)
		if bound := 2*returned + events.Partitions + 2; keys > bound || examined > bound {
			t.Errorf("find %d examined %d keys and %d documents to return %d; want at most %d", i, keys, examined, returned, bound)
		}
		// The first find is the events never retried: in index order. The
		// second, the due retries, is a range of retryAt that the server
		// sorts; there are none here.
		if i == 0 && (!strings.Contains(plan, "SORT_MERGE") || strings.Contains(plan, `"SORT"`)) {
			t.Errorf("find %d's plan is not a merge of index scans in order: %s", i, plan)
		}
	}
}

// TestContainerClaimStoresPartitions: a claim stores the partition of the
// events it reads without one, its own and other replicas', in one update.
func TestContainerClaimStoresPartitions(t *testing.T) {
	t.Parallel()
	client := testenv.ReplicaSet(t)
	s := containerStore(t, client)
	var docs []bson.D
	for i := range 200 {
		docs = append(docs, laneEvent(fmt.Sprint("e", i), "order.created", fmt.Sprint("a", i), i))
	}
	insert(t, s.Collection(), docs...)
	claimLane(t, s, "t1", events.ClaimLimit{Events: 10, Ordered: true, Owned: quarter()})
	cur, err := s.Collection().Find(t.Context(), bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	stamped := 0
	for cur.Next(t.Context()) {
		p, ok, err := events.StoredPartition(cur.Current)
		if err != nil {
			t.Errorf("%s: %v", cur.Current.Lookup("_id"), err)
		}
		if ok && p == events.Partition(cur.Current) {
			stamped++
		}
	}
	if stamped == 0 {
		t.Error("the claim stored no partition")
	}
}
