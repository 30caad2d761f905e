package mongo

import (
	"maps"
	"slices"
	"strconv"
	"testing"

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
