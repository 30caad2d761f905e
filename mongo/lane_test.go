package mongo_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/mongo/mongotest"
)

// quarter is the partitions one of four replicas owns.
func quarter() []bool {
	owned := make([]bool, events.Partitions)
	for p := range events.Partitions / 4 {
		owned[p] = true
	}
	return owned
}

// laneEvent is a NEW event of type typ for aggregate agg, ms after an
// hour ago.
func laneEvent(id, typ, aggregate string, ms int) bson.D {
	d := withType(ev(id, events.StatusNew, ago(time.Hour).Add(time.Duration(ms)*time.Millisecond)), typ)
	if aggregate != "" {
		d = append(d, agg(aggregate)...)
	}
	return d
}

// ownedAggregates returns n aggregate ids whose partition owned marks.
func ownedAggregates(prefix string, owned []bool, n int) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		id := fmt.Sprintf("%s%d", prefix, i)
		if owned[events.PartitionOf(events.Key("order", id))] {
			out = append(out, id)
		}
	}
	return out
}

// claimLane claims once with limit and marks what it claimed PUBLISHED,
// returning the claimed ids.
func claimLane(t *testing.T, s *mongo.Store, token string, limit events.ClaimLimit) []string {
	t.Helper()
	res, err := s.Claim(t.Context(), events.Lease{WorkerID: "w", Token: token, At: base}, limit)
	if err != nil {
		t.Fatalf("Claim %s: %v", token, err)
	}
	if len(res.Claimed) > 0 {
		if _, err := s.MarkPublished(t.Context(), events.Lease{WorkerID: "w", Token: token}, mongoIDs(res.Claimed), base); err != nil {
			t.Fatal(err)
		}
	}
	return ids(res.Claimed)
}

func mongoIDs(cs []events.Claimed) []any {
	out := make([]any, len(cs))
	for i, c := range cs {
		out[i] = c.ID
	}
	return out
}

// parkedFor counts the events parked for each reason.
func parkedFor(t *testing.T, coll *driver.Collection) map[string]int {
	t.Helper()
	cur, err := coll.Find(t.Context(), bson.D{{Key: events.FieldParked, Value: true}})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for cur.Next(t.Context()) {
		reason, _ := cur.Current.Lookup(events.FieldParkedFor).StringValueOK()
		out[reason]++
	}
	return out
}

// pausedHead is n events of type bulk.import, one to an aggregate, each
// made by with (nil: as it is), and how many of them owned marks.
func pausedHead(n int, owned []bool, with func(bson.D) bson.D) (docs []bson.D, ownPaused int) {
	for i := range n {
		id := fmt.Sprintf("bulk%d", i)
		d := laneEvent(id, "bulk.import", id, i)
		if with != nil {
			d = with(d)
		}
		docs = append(docs, d)
		if owned[events.PartitionOf(events.Key("order", id))] {
			ownPaused++
		}
	}
	return docs, ownPaused
}

// pausedLane inserts a paused head of n events (pausedHead, each made by
// with) and behind it ten healthy events in owned partitions (made by with
// too), and pauses the head's type. It returns how many paused events
// owned marks, and the healthy events' ids, oldest first.
func pausedLane(t *testing.T, s *mongo.Store, coll *driver.Collection, n int, owned []bool, with func(bson.D) bson.D) (ownPaused int, healthy []string) {
	t.Helper()
	if with == nil {
		with = func(d bson.D) bson.D { return d }
	}
	docs, ownPaused := pausedHead(n, owned, with)
	for i, a := range ownedAggregates("h", owned, 10) {
		docs = append(docs, with(laneEvent("ok-"+a, "order.created", a, 5000+i)))
		healthy = append(healthy, "ok-"+a)
	}
	insert(t, coll, docs...)
	pause(t, s, "bulk.import")
	return ownPaused, healthy
}

// TestPausedHeadDoesNotStarveTheLane: a replica that owns a quarter of the
// partitions, behind a head of a paused type over every partition, claims
// its healthy events with its first claim; the paused events of its own
// partitions are parked, those of the others left to their owners.
func TestPausedHeadDoesNotStarveTheLane(t *testing.T) {
	t.Parallel()
	eachClaimStrategy(t, func(t *testing.T, s *mongo.Store, coll *driver.Collection) {
		owned := quarter()
		ownPaused, want := pausedLane(t, s, coll, 2000, owned, nil)
		limit := events.ClaimLimit{Events: 10, Ordered: true, FailedHolds: true, Owned: owned}
		got := claimLane(t, s, "t1", limit)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("first claim behind the paused head (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(map[string]int{events.ParkedPaused: ownPaused}, parkedFor(t, coll)); diff != "" {
			t.Errorf("parked after the first claim (-want +got):\n%s", diff)
		}
		if got := claimLane(t, s, "t2", limit); len(got) != 0 {
			t.Errorf("second claim took %v, want nothing (all paused)", got)
		}
		mongo.ForgetParked(s) // as after a restart: the parked events are read back
		if ok, err := s.Resume(t.Context(), "bulk.import"); err != nil || !ok {
			t.Fatalf("Resume = %t, %v", ok, err)
		}
		mongo.SetPausedMaxAge(s, 0)
		claimed := 0
		for i := 0; i < 1000; i++ {
			n := len(claimLane(t, s, fmt.Sprint("r", i), events.ClaimLimit{Events: 500, Ordered: true, FailedHolds: true, Owned: owned}))
			if n == 0 {
				break
			}
			claimed += n
		}
		if claimed != ownPaused {
			t.Errorf("after the resume the replica claimed %d events, want its %d paused ones", claimed, ownPaused)
		}
	})
}

// TestResumeUnparksAStepAClaim: a resume unparks the type's parked events
// one owned partition a step, a claim's share of steps at a time, so that
// no write rewrites them all at once; the events parked without a stored
// partition (written without one, parked by FerretDB's claims) are a step
// of their own. Every paused event of the replica's partitions is claimed
// in the end, none of the others.
func TestResumeUnparksAStepAClaim(t *testing.T) {
	t.Parallel()
	eachClaimStrategy(t, func(t *testing.T, s *mongo.Store, coll *driver.Collection) {
		owned := quarter()
		docs, ownPaused := pausedHead(400, owned, nil)
		insert(t, coll, docs...)
		pause(t, s, "bulk.import")
		limit := events.ClaimLimit{Events: 500, Ordered: true, FailedHolds: true, Owned: owned}
		if got := claimLane(t, s, "t1", limit); len(got) != 0 {
			t.Fatalf("claim behind the paused head took %v, want nothing", got)
		}
		if diff := cmp.Diff(map[string]int{events.ParkedPaused: ownPaused}, parkedFor(t, coll)); diff != "" {
			t.Fatalf("parked (-want +got):\n%s", diff)
		}
		if ok, err := s.Resume(t.Context(), "bulk.import"); err != nil || !ok {
			t.Fatalf("Resume = %t, %v", ok, err)
		}
		mongo.SetPausedMaxAge(s, 0)
		mongo.SetUnparkStepsMax(s, 1)
		claimLane(t, s, "r0", limit)
		// A step per owned partition, and one for the events parked
		// without a stored partition where the claims store none.
		queued := mongo.QueuedUnparkSteps(s)
		if queued == 0 || queued > events.Partitions/4 {
			t.Errorf("after the first claim since the resume %d unpark steps wait, want up to the %d owned partitions' (and a sweep)", queued, events.Partitions/4)
		}
		claimed := 0
		for i := 1; i < 200; i++ {
			n := len(claimLane(t, s, fmt.Sprint("r", i), limit))
			claimed += n
			if n == 0 && mongo.QueuedUnparkSteps(s) == 0 {
				break
			}
		}
		if claimed != ownPaused {
			t.Errorf("after the resume the replica claimed %d events, want its %d paused ones", claimed, ownPaused)
		}
		if got := parkedFor(t, coll); len(got) != 0 {
			t.Errorf("parked at the end: %v, want none", got)
		}
	})
}

// TestFailedHeadsParkTheirAggregates: events waiting behind FAILED events
// are parked by the claim that meets them, healthy events behind them go
// out with the first claim, an event that arrives later for a held
// aggregate waits too, and once the FAILED event is requeued its
// aggregate goes out in order.
func TestFailedHeadsParkTheirAggregates(t *testing.T) {
	t.Parallel()
	eachClaimStrategy(t, func(t *testing.T, s *mongo.Store, coll *driver.Collection) {
		var docs []bson.D
		ms := 0
		for i := range 300 {
			a := fmt.Sprintf("held%d", i)
			head := laneEvent(a+"-0", "order.created", a, ms)
			head[3].Value = events.StatusFailed
			docs = append(docs, head)
			for j := 1; j <= 3; j++ {
				docs = append(docs, laneEvent(fmt.Sprintf("%s-%d", a, j), "order.created", a, ms+j))
			}
			ms += 4
		}
		for i := range 5 {
			docs = append(docs, laneEvent(fmt.Sprint("ok", i), "order.created", fmt.Sprint("fresh", i), 10000+i))
		}
		insert(t, coll, docs...)
		limit := events.ClaimLimit{Events: 5, Ordered: true, FailedHolds: true}
		if diff := cmp.Diff([]string{"ok0", "ok1", "ok2", "ok3", "ok4"}, claimLane(t, s, "t1", limit)); diff != "" {
			t.Errorf("first claim behind 300 held aggregates (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(map[string]int{events.ParkedHeld: 900}, parkedFor(t, coll)); diff != "" {
			t.Errorf("parked after the first claim (-want +got):\n%s", diff)
		}
		insert(t, coll, laneEvent("held7-4", "order.created", "held7", 20000))
		if got := claimLane(t, s, "t2", limit); len(got) != 0 {
			t.Errorf("a claim took %v from held aggregates", got)
		}
		if _, err := coll.UpdateOne(t.Context(), bson.D{{Key: events.FieldID, Value: "held7-0"}},
			bson.D{{Key: "$set", Value: bson.D{{Key: events.FieldStatus, Value: events.StatusNew}}}}); err != nil {
			t.Fatal(err)
		}
		var got []string
		for i := range 5 {
			got = append(got, claimLane(t, s, fmt.Sprint("q", i), limit)...)
		}
		if diff := cmp.Diff([]string{"held7-0", "held7-1", "held7-2", "held7-3", "held7-4"}, got); diff != "" {
			t.Errorf("the requeued aggregate (-want +got):\n%s", diff)
		}
	})
}

// TestStoredPartitionIsChecked: an event whose stored partition is not
// the one its key hashes to, or not a whole number, is FAILED with a
// reason that names the field, never claimed by the lane it names.
func TestStoredPartitionIsChecked(t *testing.T) {
	t.Parallel()
	eachClaimStrategy(t, func(t *testing.T, s *mongo.Store, coll *driver.Collection) {
		wrong := (events.PartitionOf(events.Key("order", "x")) + 1) % events.Partitions
		insert(t, coll,
			laneEvent("wrong", "order.created", "x", 0),
			laneEvent("text", "order.created", "y", 1),
			laneEvent("right", "order.created", "z", 2),
		)
		for id, v := range map[string]any{"wrong": int32(wrong), "text": "7", "right": int32(events.PartitionOf(events.Key("order", "z")))} {
			if _, err := coll.UpdateOne(t.Context(), bson.D{{Key: events.FieldID, Value: id}},
				bson.D{{Key: "$set", Value: bson.D{{Key: events.FieldPartition, Value: v}}}}); err != nil {
				t.Fatal(err)
			}
		}
		res, err := s.Claim(t.Context(), lease("w"), events.ClaimLimit{Events: 10, Ordered: true})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"right"}, ids(res.Claimed)); diff != "" {
			t.Errorf("claimed (-want +got):\n%s", diff)
		}
		for _, id := range []string{"wrong", "text"} {
			e := get(t, coll, id)
			if e.Status != events.StatusFailed || !strings.Contains(e.LastError, events.FieldPartition) {
				t.Errorf("%s: %s, %q; want FAILED naming the partition", id, e.Status, e.LastError)
			}
		}
	})
}

// TestUnorderedClaimParksPausedTypes: without ordering the paused type's
// events are parked and the rest flows; a resume puts them back.
func TestUnorderedClaimParksPausedTypes(t *testing.T) {
	t.Parallel()
	eachClaimStrategy(t, func(t *testing.T, s *mongo.Store, coll *driver.Collection) {
		pausedOutbox(t, coll)
		pause(t, s, "order.paid")
		mongo.SetPausedMaxAge(s, 0)
		limit := events.ClaimLimit{Events: 100}
		got := claimLane(t, s, "t1", limit)
		slices.Sort(got)
		if diff := cmp.Diff([]string{"a1", "a3", "b1", "b2", "u2"}, got); diff != "" {
			t.Errorf("unordered claim (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(map[string]int{events.ParkedPaused: 3}, parkedFor(t, coll)); diff != "" {
			t.Errorf("parked (-want +got):\n%s", diff)
		}
		if ok, err := s.Resume(t.Context(), "order.paid"); err != nil || !ok {
			t.Fatal(ok, err)
		}
		got = claimLane(t, s, "t2", limit)
		slices.Sort(got)
		if diff := cmp.Diff([]string{"a2", "c1", "u1"}, got); diff != "" {
			t.Errorf("after the resume (-want +got):\n%s", diff)
		}
	})
}

// headFinds counts the finds of NEW events in claim order (the lane's
// read) among what rec took.
func headFinds(rec *mongotest.Recorder, coll string) int {
	n := 0
	for _, sent := range rec.Take() {
		if sent.Name != "find" {
			continue
		}
		name, _ := sent.Command.Lookup("find").StringValueOK()
		if _, err := sent.Command.LookupErr("sort"); err == nil && name == coll {
			n++
		}
	}
	return n
}

// TestReadAheadFeedsTheNextClaims: while a backlog drains, one read of the
// lane feeds the next claims, which read only the holds; a release drops
// it.
func TestReadAheadFeedsTheNextClaims(t *testing.T) {
	t.Parallel()
	s, rec := mongotest.RecordingStore(t)
	var docs []bson.D
	for i := range 30 {
		docs = append(docs, laneEvent(fmt.Sprintf("e%02d", i), "order.created", fmt.Sprint("a", i%7), i))
	}
	insert(t, s.Collection(), docs...)
	limit := events.ClaimLimit{Events: 5, Ordered: true, FailedHolds: true}
	var got []string
	for i := range 3 {
		got = append(got, claimLane(t, s, fmt.Sprint("t", i), limit)...)
		limit.Draining = true
	}
	if n := headFinds(rec, s.Collection().Name()); n != 1 {
		t.Errorf("three claims of a drain read the lane %d times, want 1", n)
	}
	if diff := cmp.Diff(ids15(), got); diff != "" {
		t.Errorf("claimed (-want +got):\n%s", diff)
	}
	res, err := s.Claim(t.Context(), events.Lease{WorkerID: "w", Token: "r", At: base}, limit)
	if err != nil || len(res.Claimed) != 5 {
		t.Fatalf("Claim = %d events, %v", len(res.Claimed), err)
	}
	if _, err := s.Release(t.Context(), events.Lease{WorkerID: "w", Token: "r"}, events.Release{IDs: mongoIDs(res.Claimed), Status: events.StatusNew, Refund: true}); err != nil {
		t.Fatal(err)
	}
	rec.Take()
	if diff := cmp.Diff(ids(res.Claimed), claimLane(t, s, "after", limit)); diff != "" {
		t.Errorf("after a release the claim took (-want +got):\n%s", diff)
	}
	if n := headFinds(rec, s.Collection().Name()); n != 1 {
		t.Errorf("the claim after a release read the lane %d times, want 1 (the read-ahead dropped)", n)
	}
}

// TestReadAheadOfASharedLaneKeepsItsOwn: on FerretDB a whole read of a
// lane a quarter of which this replica owns reads four windows' worth
// and keeps only its own partitions' events ahead, so one read feeds the
// next claims as it does for a replica that owns every partition. With a
// window of one replica's size its read-ahead held a quarter of its own,
// and the third claim read the lane again.
func TestReadAheadOfASharedLaneKeepsItsOwn(t *testing.T) {
	t.Parallel()
	s, rec := mongotest.RecordingStore(t)
	mongo.SetSplitClaim(s, false) // MongoDB's reads name the owned partitions
	owned := quarter()
	var docs []bson.D
	var want []string
	for i := range 400 {
		id := fmt.Sprintf("e%03d", i)
		d := stamped(laneEvent(id, "order.created", fmt.Sprint("a", i), i))
		docs = append(docs, d)
		if owned[events.Partition(toRaw(d))] && len(want) < 25 {
			want = append(want, id)
		}
	}
	insert(t, s.Collection(), docs...)
	limit := events.ClaimLimit{Events: 5, Ordered: true, FailedHolds: true, Owned: owned}
	var got []string
	for i := range 5 {
		got = append(got, claimLane(t, s, fmt.Sprint("t", i), limit)...)
		limit.Draining = true
	}
	if n := headFinds(rec, s.Collection().Name()); n != 1 {
		t.Errorf("five claims of a drain read the shared lane %d times, want 1", n)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("claimed (-want +got):\n%s", diff)
	}
}

func ids15() []string {
	var out []string
	for i := range 15 {
		out = append(out, fmt.Sprintf("e%02d", i))
	}
	return out
}

// TestReadAheadKeepsWhatWasHeld: an event held when the lane was read (an
// earlier event of its aggregate PROCESSING) is not claimed from the
// read-ahead after its hold went without the read-ahead seeing the event
// that held it (recovery put it back to NEW): it waits for a read that
// sees both, and goes after it.
func TestReadAheadKeepsWhatWasHeld(t *testing.T) {
	t.Parallel()
	eachClaimStrategy(t, func(t *testing.T, s *mongo.Store, coll *driver.Collection) {
		var docs []bson.D
		for i := range 10 {
			docs = append(docs, laneEvent(fmt.Sprintf("e%02d", i), "order.created", fmt.Sprint("free", i), i))
		}
		first := laneEvent("k1", "order.created", "k", 20)
		first[3].Value = events.StatusProcessing
		docs = append(docs, first, laneEvent("k2", "order.created", "k", 21))
		insert(t, coll, docs...)
		limit := events.ClaimLimit{Events: 5, Ordered: true, FailedHolds: true}
		got := claimLane(t, s, "t1", limit)
		if _, err := coll.UpdateOne(t.Context(), bson.D{{Key: events.FieldID, Value: "k1"}},
			bson.D{{Key: "$set", Value: bson.D{{Key: events.FieldStatus, Value: events.StatusNew}}}}); err != nil {
			t.Fatal(err)
		}
		limit.Draining = true
		for i := range 4 {
			got = append(got, claimLane(t, s, fmt.Sprint("t", i+2), limit)...)
		}
		want := []string{"e00", "e01", "e02", "e03", "e04", "e05", "e06", "e07", "e08", "e09", "k1", "k2"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("claimed in turn (-want +got):\n%s", diff)
		}
	})
}

// TestReadAheadOnlyAfterTheWholeBatch: a claim whose write takes fewer
// events than its read returned (the claimer's fence trimmed the batch)
// leaves the read-ahead unused, so the next claim starts from the events
// left NEW, in order.
func TestReadAheadOnlyAfterTheWholeBatch(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	var docs []bson.D
	for i := range 20 {
		docs = append(docs, laneEvent(fmt.Sprintf("e%02d", i), "order.created", "one", i))
	}
	insert(t, coll, docs...)
	limit := events.ClaimLimit{Events: 5, Ordered: true, FailedHolds: true}
	read, more, err := s.ReadClaimable(t.Context(), base, limit)
	if err != nil || len(read) != 5 || !more {
		t.Fatalf("ReadClaimable = %d docs, %t, %v", len(read), more, err)
	}
	l := events.Lease{WorkerID: "w", Token: "trimmed", At: base}
	res, err := s.ClaimRead(t.Context(), l, read[:3], limit)
	if err != nil || len(res.Claimed) != 3 {
		t.Fatalf("ClaimRead of 3 = %d, %v", len(res.Claimed), err)
	}
	if _, err := s.MarkPublished(t.Context(), l, mongoIDs(res.Claimed), base); err != nil {
		t.Fatal(err)
	}
	limit.Draining = true
	if diff := cmp.Diff([]string{"e03", "e04", "e05", "e06", "e07"}, claimLane(t, s, "next", limit)); diff != "" {
		t.Errorf("the claim after a trimmed one (-want +got):\n%s", diff)
	}
}
