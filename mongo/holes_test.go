package mongo_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

// The tests of this file each close one way the claim path once had of
// publishing a later event of an aggregate before an earlier one (issue
// 40): each failed before its fix.

// TestByteCutKeepsTheCutEventFirst: a claim cut by its byte bound does not
// drop the event that did not fit. That event starts the read-ahead, so
// the next claim of the drain, served from it, takes it before any later
// event of its aggregate. Before: the read-ahead began after it, and the
// next claim took a2 while a1 was still NEW.
func TestByteCutKeepsTheCutEventFirst(t *testing.T) {
	t.Parallel()
	eachClaimStrategy(t, func(t *testing.T, s *mongo.Store, coll *driver.Collection) {
		pad := bson.E{Key: "pad", Value: strings.Repeat("p", 4<<10)}
		docs := []bson.D{
			laneEvent("x0", "order.created", "x", 0),
			append(laneEvent("a1", "order.created", "a", 1), pad),
			laneEvent("a2", "order.created", "a", 2),
		}
		for i := range 12 {
			docs = append(docs, laneEvent(fmt.Sprintf("f%02d", i), "order.created", fmt.Sprint("free", i), 10+i))
		}
		insert(t, coll, docs...)
		limit := events.ClaimLimit{Events: 4, Bytes: 2 << 10, Ordered: true, FailedHolds: true}
		var got []string
		for i := range 8 {
			got = append(got, claimLane(t, s, fmt.Sprint("t", i), limit)...)
			limit.Draining = true
		}
		a1, a2 := slices.Index(got, "a1"), slices.Index(got, "a2")
		if a1 < 0 || a2 < 0 || a2 < a1 {
			t.Errorf("claimed in turn %v: a2 at %d, a1 at %d; want a1 first", got, a2, a1)
		}
	})
}

// aggregateIn returns an aggregate id of type order whose partition is p.
func aggregateIn(p int) string {
	for i := 0; ; i++ {
		if id := fmt.Sprint("agg", i); events.PartitionOf(events.Key("order", id)) == p {
			return id
		}
	}
}

// TestResumeHoldsUntilItsUnparkIsWritten: a resume is unparked a step (a
// partition) at a time, and an aggregate whose parked event waits for a
// later step still holds the events written after the resume. Before: the
// resume forgot the key at once, and the next claim took k2 while k1 was
// still parked: claimed in turn [k2 k1].
func TestResumeHoldsUntilItsUnparkIsWritten(t *testing.T) {
	t.Parallel()
	eachClaimStrategy(t, func(t *testing.T, s *mongo.Store, coll *driver.Collection) {
		id := aggregateIn(events.Partitions - 1) // the last partition's step comes last
		insert(t, coll, laneEvent("k1", "bulk.import", id, 0))
		pause(t, s, "bulk.import")
		limit := events.ClaimLimit{Events: 10, Ordered: true, FailedHolds: true}
		if got := claimLane(t, s, "paused", limit); len(got) != 0 {
			t.Fatalf("claim behind the paused event took %v, want nothing", got)
		}
		if ok, err := s.Resume(t.Context(), "bulk.import"); err != nil || !ok {
			t.Fatalf("Resume = %t, %v", ok, err)
		}
		mongo.SetPausedMaxAge(s, 0)
		mongo.SetUnparkStepsMax(s, 1)
		insert(t, coll, laneEvent("k2", "order.created", id, 10))
		var got []string
		for i := 0; i < 3*events.Partitions && len(got) < 2; i++ {
			got = append(got, claimLane(t, s, fmt.Sprint("r", i), limit)...)
		}
		if !slices.Equal(got, []string{"k1", "k2"}) {
			t.Errorf("claimed in turn %v, want [k1 k2]", got)
		}
	})
}
