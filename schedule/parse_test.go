package schedule_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxrelay/outbox/schedule"
)

func TestParseEveryKeepsItsDelay(t *testing.T) {
	t.Parallel()
	// A time with a fraction of a second, where cron's rounding shows.
	from := time.Date(2026, 1, 2, 3, 4, 5, 250_000_000, time.UTC)
	tests := []struct {
		spec string
		want []time.Duration // gaps between the next three ticks after from
	}{
		{"@every 100ms", []time.Duration{100 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond}},
		{"@every 1500ms", []time.Duration{1500 * time.Millisecond, 1500 * time.Millisecond, 1500 * time.Millisecond}},
		// Whole seconds too count from the start, not from the wall
		// clock's whole seconds (cron alone would tick after 750ms first).
		{"@every 1s", []time.Duration{time.Second, time.Second, time.Second}},
		{"@every 2s", []time.Duration{2 * time.Second, 2 * time.Second, 2 * time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			t.Parallel()
			s, err := schedule.Parse(tt.spec)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			var got []time.Duration
			for at := from; len(got) < 3; {
				next := s.Next(at)
				got = append(got, next.Sub(at))
				at = next
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("gaps between ticks (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseRejects(t *testing.T) {
	t.Parallel()
	for _, spec := range []string{"@every -100ms", "@every -1s", "@every 0s", "@every soon", "* * *", ""} {
		if _, err := schedule.Parse(spec); err == nil {
			t.Errorf("Parse(%q) = nil error, want an error", spec)
		}
	}
}
