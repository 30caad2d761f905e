package mongo_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/mongo/mongotest"
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

// aggregateIn returns an aggregate id of type order whose partition is
// p, other than those of not.
func aggregateIn(p int, not ...string) string {
	for i := 0; ; i++ {
		if id := fmt.Sprint("agg", i); events.PartitionOf(events.Key("order", id)) == p && !slices.Contains(not, id) {
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

// TestLostEventHoldsItsKey a claim whose write loses
// an event it read to another write (another worker's claim; on FerretDB
// two guarded updates can both read it as NEW) does not keep a later
// event of that aggregate: it puts it back, attempt refunded. Before:
// only an event the server refused held its key, and the claim kept k2
// while k1 was another worker's ("claimed [k2 f], want [f]").
func TestLostEventHoldsItsKey(t *testing.T) {
	t.Parallel()
	eachClaimStrategy(t, func(t *testing.T, s *mongo.Store, coll *driver.Collection) {
		insert(t, coll, laneEvent("k1", "order.created", "k", 0), laneEvent("k2", "order.created", "k", 1),
			laneEvent("f", "order.created", "free", 2))
		limit := events.ClaimLimit{Events: 10, Ordered: true, FailedHolds: true}
		docs, _, err := s.ReadClaimable(t.Context(), base, limit)
		if err != nil || len(docs) != 3 {
			t.Fatalf("ReadClaimable = %d docs, %v; want 3", len(docs), err)
		}
		if _, err := coll.UpdateOne(t.Context(), bson.D{{Key: events.FieldID, Value: "k1"}}, bson.D{{Key: "$set", Value: bson.D{
			{Key: events.FieldStatus, Value: events.StatusProcessing}, {Key: events.FieldWorkerID, Value: "other"},
		}}}); err != nil {
			t.Fatal(err)
		}
		res, err := s.ClaimRead(t.Context(), events.Lease{WorkerID: "w", Token: "late", At: base}, docs, limit)
		if err != nil {
			t.Fatal(err)
		}
		if got := ids(res.Claimed); !slices.Equal(got, []string{"f"}) {
			t.Errorf("claimed %v, want [f]", got)
		}
		if st := mongotest.Statuses(t, coll)["k2"]; st != events.StatusNew {
			t.Errorf("k2 is %s, want NEW behind k1", st)
		}
	})
}

// TestHeldHeadLongerThanARead: more events held for now (behind their
// aggregate's first event, backing off) than one claim's read goes
// through do not stop the claims: the next read resumes where the last
// stopped, with the keys it held, and takes the healthy events behind
// them; none of the held aggregate's. Before: every claim read the same
// held events from the head and stopped ("claimed [] in 6 claims, want
// the 5 healthy events").
func TestHeldHeadLongerThanARead(t *testing.T) {
	t.Parallel()
	eachClaimStrategy(t, func(t *testing.T, s *mongo.Store, coll *driver.Collection) {
		mongo.SetMaxHeadRead(s, 50)
		first := laneEvent("hot000", "order.created", "hot", 0)
		first = append(first, bson.E{Key: events.FieldRetryAt, Value: base.Add(time.Hour)})
		docs := []bson.D{first}
		for i := 1; i <= 80; i++ {
			docs = append(docs, laneEvent(fmt.Sprintf("hot%03d", i), "order.created", "hot", i))
		}
		var healthy []string
		for i := range 5 {
			id := fmt.Sprint("ok", i)
			healthy = append(healthy, id)
			docs = append(docs, laneEvent(id, "order.created", id, 100+i))
		}
		insert(t, coll, docs...)
		limit := events.ClaimLimit{Events: 10, Ordered: true, FailedHolds: true}
		var got []string
		for i := range 6 {
			got = append(got, claimLane(t, s, fmt.Sprint("t", i), limit)...)
		}
		slices.Sort(got)
		if !slices.Equal(got, healthy) {
			t.Errorf("claimed %v in 6 claims, want the 5 healthy events %v", got, healthy)
		}
	})
}

// TestStoredParkedNotTrueFails: an event whose stored parked is not true
// (a producer's false) is failed with a reason naming the field, not left
// outside every lane. Before: on MongoDB it was never claimed (outside
// the lane's parked: null) and never unparked: NEW for good. (An
// aggregateType with a NUL byte, which PostgreSQL cannot store, is
// checked in events and claim/plan.)
func TestStoredParkedNotTrueFails(t *testing.T) {
	t.Parallel()
	eachClaimStrategy(t, func(t *testing.T, s *mongo.Store, coll *driver.Collection) {
		insert(t, coll, append(laneEvent("notparked", "order.created", "x", 1), field(events.FieldParked, false)))
		limit := events.ClaimLimit{Events: 10, Ordered: true, FailedHolds: true}
		for i := range 3 {
			claimLane(t, s, fmt.Sprint("t", i), limit)
		}
		var doc bson.M
		if err := coll.FindOne(t.Context(), bson.D{{Key: events.FieldID, Value: "notparked"}}).Decode(&doc); err != nil {
			t.Fatal(err)
		}
		msg, _ := doc[events.FieldLastError].(string)
		if doc[events.FieldStatus] != string(events.StatusFailed) || !strings.Contains(msg, events.FieldParked) {
			t.Errorf("the event is %v with lastError %q, want FAILED naming %s", doc[events.FieldStatus], msg, events.FieldParked)
		}
	})
}

// TestParkingUncappedOnMongoDB: on MongoDB one claim parks every paused
// event its read met, not 1,000: the cap spares FerretDB an $in it
// matches in Go against every NEW event, and MongoDB matches it through
// the _id index. Before: 1,000 of 1,500, the rest read again by the next
// claims.
func TestParkingUncappedOnMongoDB(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	mongo.SetSplitClaim(s, true)
	var docs []bson.D
	for i := range 1500 {
		docs = append(docs, laneEvent(fmt.Sprintf("p%04d", i), "bulk.import", fmt.Sprint("a", i), i))
	}
	insert(t, coll, docs...)
	pause(t, s, "bulk.import")
	claimLane(t, s, "t", events.ClaimLimit{Events: 10, Ordered: true, FailedHolds: true})
	if got := parkedFor(t, coll)[events.ParkedPaused]; got != 1500 {
		t.Errorf("one claim parked %d of 1,500 paused events, want all", got)
	}
}

// TestPartitionRetakenReadsParkedAgain: a replica that lost a partition
// and took it back between two of its claims reads the partition's parked
// events again: the other owner parked k1 meanwhile, and k2, written
// after, waits behind it. Before: the replica kept the parked keys it had
// read under its first tenure and claimed k2 while k1 was parked
// ("claimed in turn [x0 k2]").
func TestPartitionRetakenReadsParkedAgain(t *testing.T) {
	t.Parallel()
	eachClaimStrategy(t, func(t *testing.T, a *mongo.Store, coll *driver.Collection) {
		b := mongo.New(coll.Database().Client(), mongo.Config{Database: coll.Database().Name(), Collection: coll.Name()})
		if err := b.Prepare(t.Context()); err != nil {
			t.Fatal(err)
		}
		mongo.SetSplitClaim(b, mongo.SplitClaim(a))
		id := aggregateIn(7)
		held := func(tenure int64) events.ClaimLimit {
			owned, tenures := make([]bool, events.Partitions), make([]int64, events.Partitions)
			owned[7], tenures[7] = true, tenure
			return events.ClaimLimit{Events: 10, Ordered: true, FailedHolds: true, Owned: owned, Tenures: tenures}
		}
		other := aggregateIn(7, id)
		insert(t, coll, laneEvent("x0", "order.created", other, 0))
		var got []string
		got = append(got, claimLane(t, a, "a1", held(1))...) // a reads partition 7's parked keys: none
		insert(t, coll, laneEvent("k1", "bulk.import", id, 0))
		pause(t, b, "bulk.import")
		mongo.SetPausedMaxAge(b, 0)
		got = append(got, claimLane(t, b, "b1", held(2))...) // b, owner under tenure 2, parks k1
		if ok, err := b.Resume(t.Context(), "bulk.import"); err != nil || !ok {
			t.Fatalf("Resume = %t, %v", ok, err)
		}
		insert(t, coll, laneEvent("k2", "order.created", id, 10))
		mongo.SetPausedMaxAge(a, 0)
		for i := range 4 { // a, owner again under tenure 3
			got = append(got, claimLane(t, a, fmt.Sprint("a", i+2), held(3))...)
		}
		if !slices.Equal(got, []string{"x0", "k1", "k2"}) {
			t.Errorf("claimed in turn %v, want [x0 k1 k2]", got)
		}
	})
}
