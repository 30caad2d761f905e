package events

import (
	"testing"
	"time"
)

// Ages are never negative: a producer's clock ahead of the server's makes
// an event look younger than now, not a backlog ahead of schedule.
func TestAgesAreNeverNegative(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	st := Stats{OldestNew: created}
	held := HeldStats{OldestWaiting: created}
	for _, tc := range []struct {
		now  time.Time
		want time.Duration
	}{
		{created.Add(-time.Minute), 0},
		{created, 0},
		{created.Add(time.Minute), time.Minute},
	} {
		if got := st.OldestNewAge(tc.now); got != tc.want {
			t.Errorf("OldestNewAge at created%+v = %s, want %s", tc.now.Sub(created), got, tc.want)
		}
		if got := held.OldestAge(tc.now); got != tc.want {
			t.Errorf("OldestAge at created%+v = %s, want %s", tc.now.Sub(created), got, tc.want)
		}
	}
	if got := (Stats{}).OldestNewAge(created); got != 0 {
		t.Errorf("OldestNewAge with no NEW event = %s, want 0", got)
	}
	if got := (HeldStats{}).OldestAge(created); got != 0 {
		t.Errorf("OldestAge with nothing held = %s, want 0", got)
	}
}
