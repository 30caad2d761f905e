package ownership

import (
	"testing"

	"github.com/outboxrelay/outbox/events"
)

// A claim the database's fence refused drops its partition at once, and
// the next term of it is numbered above the fence: after a dropped owners
// collection the terms restart below the fences, and a holder that kept
// the partition had every claim refused and never let go.
func TestFencedPartitionIsTakenAboveTheFence(t *testing.T) {
	t.Parallel()
	_, _, a := startAlone(t)
	_, _, done := a.Hold()
	a.Wrote(nil, &events.FencedError{Fences: map[int]int64{7: 57}})
	done()
	terms, _, done := a.Hold()
	done()
	if terms[7] != 0 {
		t.Errorf("a may still claim in 7 under tenure %d after the fence refused it", terms[7])
	}
	tick(t, a)
	terms, _, done = a.Hold()
	done()
	if terms[7] <= 57 {
		t.Errorf("a's tenure of 7 after its next round = %d, want above the fence's 57", terms[7])
	}
	if terms[8] != 1 {
		t.Errorf("a's tenure of 8 = %d, want 1: only the refused partition changes hands", terms[8])
	}
}
