package plan_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/claim/plan"
	"github.com/outboxrelay/outbox/events"
)

var base = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// lane is a random lane and snapshot: the input of one property check.
type lane struct {
	snap plan.Snapshot
	docs []bson.Raw
	// parked, unparking, held and failed are the snapshot's key sets,
	// kept apart from the snapshot.
	parked, unparking, held, failed map[string]bool
}

// randomLane draws a lane of up to 60 events of a few aggregates (some
// without one), of three types, some backing off, some without a stored
// partition or with a wrong one, and a snapshot with random holds, paused
// types, owned partitions and limits.
func randomLane(r *rand.Rand) lane {
	nKeys := 1 + r.IntN(6)
	keys := make([]string, nKeys)
	for i := range keys {
		keys[i] = fmt.Sprint("agg", i)
	}
	types := []string{"a", "b", "c"}
	var docs []bson.Raw
	for i := range r.IntN(60) {
		d := bson.D{
			{Key: events.FieldID, Value: fmt.Sprintf("e%03d", i)},
			{Key: events.FieldType, Value: types[r.IntN(len(types))]},
			{Key: events.FieldStatus, Value: events.StatusNew},
			{Key: events.FieldCreatedAt, Value: base.Add(time.Duration(i) * time.Millisecond)},
		}
		if r.IntN(8) > 0 {
			d = append(d,
				bson.E{Key: events.FieldAggregateType, Value: "order"},
				bson.E{Key: events.FieldAggregateID, Value: keys[r.IntN(nKeys)]})
		}
		if r.IntN(10) == 0 {
			d = append(d, bson.E{Key: events.FieldRetryAt, Value: base.Add(time.Hour)})
		}
		raw, _ := bson.Marshal(d)
		p := events.Partition(raw)
		switch r.IntN(12) {
		case 0: // written without a partition
		case 1: // misfiled
			d = append(d, bson.E{Key: events.FieldPartition, Value: int32((p + 1) % events.Partitions)})
		default:
			d = append(d, bson.E{Key: events.FieldPartition, Value: int32(p)})
		}
		switch r.IntN(40) {
		case 0: // a producer's own parked, which no lane reads
			d = append(d, bson.E{Key: events.FieldParked, Value: false})
		case 1: // an aggregateType no parked key can be cut back into
			for i := range d {
				if d[i].Key == events.FieldAggregateType {
					d[i].Value = "or\x00der"
				}
			}
		}
		if r.IntN(3) == 0 {
			d = append(d, bson.E{Key: "pad", Value: strings.Repeat("p", r.IntN(400))})
		}
		raw, _ = bson.Marshal(d)
		docs = append(docs, raw)
	}
	someKeys := func(n int) map[string]bool {
		m := map[string]bool{}
		for range r.IntN(n + 1) {
			m[events.Key("order", keys[r.IntN(nKeys)])] = true
		}
		return m
	}
	l := lane{docs: docs, parked: someKeys(1), unparking: someKeys(1), held: someKeys(1), failed: someKeys(1)}
	paused := map[string]bool{}
	if r.IntN(3) == 0 {
		paused[types[r.IntN(len(types))]] = true
	}
	var owned []bool
	if r.IntN(2) == 0 {
		owned = make([]bool, events.Partitions)
		for p := range owned {
			owned[p] = r.IntN(3) > 0
		}
	}
	bytes := 0
	if r.IntN(2) == 0 {
		bytes = 100 + r.IntN(1500)
	}
	l.snap = plan.Snapshot{
		Now: base, Ordered: r.IntN(6) > 0, Owned: owned,
		Events: 1 + r.IntN(10), Bytes: bytes, Ahead: r.IntN(3) * r.IntN(20),
		Held: clone(l.held), Failed: clone(l.failed), Parked: plan.KeySet(l.parked), Unparking: plan.KeySet(l.unparking), Paused: paused,
		WithBackoff: r.IntN(2) == 0, LaneOwned: r.IntN(2) == 0, Stamp: r.IntN(2) == 0,
	}
	if !l.snap.WithBackoff {
		// The lane leaves out the events backing off, and the holds read
		// beside it hold their keys (the store's heldKeys).
		l.docs = slices.DeleteFunc(l.docs, func(d bson.Raw) bool {
			at, ok := d.Lookup(events.FieldRetryAt).TimeOK()
			if ok && at.After(base) {
				if key, ok := events.OrderingKey(d); ok {
					l.held[key], l.snap.Held[key] = true, true
				}
				return true
			}
			return false
		})
	}
	return l
}

func clone(m map[string]bool) map[string]bool {
	out := make(map[string]bool, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// TestPlanProperties checks the plan's promise (package doc) on 20,000
// random lanes, each planned as one claim and then as the claim of the
// drain that the read-ahead serves next.
func TestPlanProperties(t *testing.T) {
	t.Parallel()
	lanes := uint64(20000)
	if raceEnabled {
		lanes /= 10
	}
	for seed := range lanes {
		checkSeed(t, seed)
		if t.Failed() {
			return
		}
	}
}

// FuzzPlan checks the same properties on the lanes the fuzzer's seeds
// draw: `go test -fuzz FuzzPlan ./claim/plan` searches for as long as
// asked.
func FuzzPlan(f *testing.F) {
	for seed := range uint64(50) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, seed uint64) { checkSeed(t, seed) })
}

func checkSeed(t *testing.T, seed uint64) {
	t.Helper()
	l := randomLane(rand.New(rand.NewPCG(seed, 40)))
	first := plan.Plan(l.snap, l.docs)
	checkLimits(t, seed, l, first)
	// The next claim of the drain: served from the read-ahead, with the
	// keys held and parked when the first stopped.
	next := l.snap
	next.Held = clone(first.Held)
	parked := clone(l.parked)
	for _, p := range first.Park {
		parked[p.Key] = true
	}
	next.Parked, next.Ahead = plan.KeySet(parked), 0
	second := plan.Plan(next, first.Ahead)
	checkLimits(t, seed, lane{snap: next, docs: first.Ahead}, second)
	if l.snap.Ordered {
		checkPrefixes(t, seed, l, slices.Concat(first.Batch, second.Batch))
	}
}

// checkLimits checks one plan: nothing paused or unowned taken, the
// bounds kept, and the read-ahead the lane's owned events right after
// the batch, the one a bound cut first.
func checkLimits(t *testing.T, seed uint64, l lane, out plan.Outcome) {
	t.Helper()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf("seed %d: "+format, append([]any{seed}, args...)...)
	}
	if len(out.Batch) > l.snap.Events {
		fail("batch of %d events, bound %d", len(out.Batch), l.snap.Events)
	}
	size := 0
	for _, d := range out.Batch {
		size += len(d)
		typ, _ := d.Lookup(events.FieldType).StringValueOK()
		if l.snap.Paused[typ] && !misfiled(d) {
			fail("took %s of paused type %s", id(d), typ)
		}
	}
	if l.snap.Bytes > 0 && size > l.snap.Bytes && len(out.Batch) > 1 {
		fail("batch of %d bytes, bound %d", size, l.snap.Bytes)
	}
	if len(out.Ahead) > l.snap.Ahead {
		fail("read-ahead of %d events, bound %d", len(out.Ahead), l.snap.Ahead)
	}
	if len(out.Ahead) == 0 {
		return
	}
	// What the plan takes of an event does not depend on the bounds: an
	// unbounded plan of the same lane takes every event the bounded one
	// may. Each of those up to the read-ahead's end is in the batch or
	// the read-ahead (none dropped from both), and the read-ahead is the
	// owned events of the lane from its first on.
	all := l.snap
	all.Events, all.Bytes, all.Ahead = len(l.docs)+1, 0, 0
	end := index(l.docs, out.Ahead[len(out.Ahead)-1])
	kept := map[string]bool{}
	for _, d := range slices.Concat(out.Batch, out.Ahead) {
		kept[id(d)] = true
	}
	for _, d := range plan.Plan(all, l.docs).Batch {
		if index(l.docs, d) <= end && !kept[id(d)] {
			fail("dropped %s: in neither the batch %v nor the read-ahead %v", id(d), ids(out.Batch), ids(out.Ahead))
		}
	}
	var want []bson.Raw
	for _, d := range l.docs[index(l.docs, out.Ahead[0]) : end+1] {
		// A misfiled event is the claim's where the read named its lanes.
		if l.snap.Owned == nil || l.snap.Owned[events.Partition(d)] || wrongPartition(d) && l.snap.LaneOwned {
			want = append(want, d)
		}
	}
	if !slices.EqualFunc(want, out.Ahead, func(a, b bson.Raw) bool { return id(a) == id(b) }) {
		fail("read-ahead %v, want the owned events of the lane from its first %v", ids(out.Ahead), ids(want))
	}
}

// checkPrefixes checks that what the claims took of each key, in the
// order taken, is a prefix of the key's events in the lane, and nothing
// of a key held, failed or parked when the first claim planned.
func checkPrefixes(t *testing.T, seed uint64, l lane, taken []bson.Raw) {
	t.Helper()
	byKey := map[string][]string{}
	// A misfiled event is taken only to be failed, never published: it
	// is no part of its key's order.
	for _, d := range l.docs {
		if key, ok := events.OrderingKey(d); ok && !misfiled(d) {
			byKey[key] = append(byKey[key], id(d))
		}
	}
	got := map[string][]string{}
	for _, d := range taken {
		key, ok := events.OrderingKey(d)
		if !ok || misfiled(d) {
			continue
		}
		if l.held[key] || l.failed[key] || l.parked[key] || l.unparking[key] {
			t.Errorf("seed %d: took %s of key %q, which was held", seed, id(d), key)
		}
		got[key] = append(got[key], id(d))
	}
	for key, ids := range got {
		if want := byKey[key][:min(len(ids), len(byKey[key]))]; !slices.Equal(ids, want) {
			t.Errorf("seed %d: took %v of key %q, whose lane is %v: not a prefix", seed, ids, key, byKey[key])
		}
	}
}

// misfiled reports whether d fails events.CheckLane (a stored partition
// not its own, a parked not true, a NUL byte in aggregateType): a claim
// takes such an event only to fail it (events.CheckManaged), and the
// claim's write then holds back the later events of its key in the batch.
func misfiled(d bson.Raw) bool { return events.CheckLane(d) != nil }

// wrongPartition reports whether d's stored partition is not its own.
func wrongPartition(d bson.Raw) bool {
	_, _, err := events.StoredPartition(d)
	return err != nil
}

func id(d bson.Raw) string {
	s, _ := d.Lookup(events.FieldID).StringValueOK()
	return s
}

func ids(docs []bson.Raw) []string {
	out := make([]string, len(docs))
	for i, d := range docs {
		out[i] = id(d)
	}
	return out
}

func index(docs []bson.Raw, d bson.Raw) int {
	return slices.IndexFunc(docs, func(x bson.Raw) bool { return id(x) == id(d) })
}
