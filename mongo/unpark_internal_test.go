package mongo

import (
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxrelay/outbox/events"
)

// An unpark is cut into steps of one owned partition each: a resumed type
// takes a step per owned partition, held keys a step per partition they
// hash to, and what was parked without a stored partition one more step,
// so that no write rewrites more than one partition's parked events.
func TestUnparkSteps(t *testing.T) {
	t.Parallel()
	owned := make([]bool, events.Partitions)
	owned[3], owned[9] = true, true
	keyA, keyB := "order\x00a", "order\x00b"
	r := release{
		types:     []string{"resumed"},
		held:      []string{keyA, keyB},
		unstamped: map[string]bool{"resumed": true, keyB: true},
	}
	var got []string
	for _, s := range unparkSteps(owned, r) {
		got = append(got, s.what+" @ "+partitionName(s.partition))
	}
	pA, pB := events.PartitionOf(keyA), events.PartitionOf(keyB)
	want := []string{
		"the events of type resumed @ 3",
		"the events of type resumed @ 9",
		"the events of type resumed @ none",
	}
	// The keys' steps come by partition, the unstamped sweep first.
	keySteps := map[int]int{pA: 1, noPartition: 1}
	keySteps[pB]++
	for _, p := range slices.Sorted(maps.Keys(keySteps)) {
		want = append(want, "the events of "+strconv.Itoa(keySteps[p])+" aggregates @ "+partitionName(p))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("unparkSteps (-want +got):\n%s", diff)
	}
}

func partitionName(p int) string {
	if p == noPartition {
		return "none"
	}
	return strconv.Itoa(p)
}

// TestParkInDoubtIsNotUnparked: a key whose park's write failed is not
// released (unparked) before that write's deadline: landing after the
// unpark, the park would leave its events parked with nothing left to
// unpark them, and a later event of the key could go first.
func TestParkInDoubtIsNotUnparked(t *testing.T) {
	t.Parallel()
	var c parkedKeys
	c.add("order\x00k", "order.created", events.ParkedHeld, true)
	now := time.Now()
	c.inDoubt([]string{"order\x00k"}, now.Add(5*time.Second))
	if r := c.released(nil, nil, now); len(r.held) != 0 {
		t.Errorf("released %v while its park may still land, want nothing", r.held)
	}
	if r := c.released(nil, nil, now.Add(6*time.Second)); len(r.held) != 1 {
		t.Errorf("released %v past the park's deadline, want the key", r.held)
	}
}

// TestUnparkStepInDoubtCountsAsMoving: an unpark step whose write failed
// may land later; its retry moving nothing must still count as moving
// some, so that the claim drops a read-ahead read before it landed, which
// could serve a later event of the key before the one it put back (found
// by claim/plan/check at seed 9375).
func TestUnparkStepInDoubtCountsAsMoving(t *testing.T) {
	t.Parallel()
	var q unparkQueue
	q.add([]unparkStep{{what: "a", partition: 3}})
	q.doubt()
	step, ok := q.next()
	if !ok || !step.inDoubt {
		t.Fatalf("first step after a failed write: %+v, %t; want it in doubt", step, ok)
	}
}

// TestParkInDoubtSurvivesAReload: the full reload of the parked keys, once
// a minute, keeps a key whose park is in doubt: the reload may read
// before the park lands, and forgetting the key would leave what it
// parks with nothing to unpark it.
func TestParkInDoubtSurvivesAReload(t *testing.T) {
	t.Parallel()
	var c parkedKeys
	now := time.Now()
	c.toLoad(nil, nil, now)
	c.add("order\x00k", "order.created", events.ParkedHeld, true)
	c.inDoubt([]string{"order\x00k"}, now.Add(2*parkedReload))
	if _, full := c.toLoad(nil, nil, now.Add(parkedReload)); !full {
		t.Fatal("no full reload a parkedReload later")
	}
	if !c.holds("order\x00k") {
		t.Error("the key whose park is in doubt was forgotten by the reload")
	}
}
