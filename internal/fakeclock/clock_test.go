package fakeclock

import (
	"testing"
	"time"
)

func TestClockMovesOnlyByAdvance(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := New(start)
	if got := c.Now(); !got.Equal(start) {
		t.Fatalf("Now = %s, want the start %s", got, start)
	}
	c.Advance(90 * time.Second)
	if got, want := c.Now(), start.Add(90*time.Second); !got.Equal(want) {
		t.Errorf("Now after Advance(90s) = %s, want %s", got, want)
	}
	if got, want := c.Mono(), start.Add(90*time.Second); !got.Equal(want) {
		t.Errorf("Mono after Advance(90s) = %s, want %s", got, want)
	}
}

// A Step sets the wall clock and nothing else: Mono, which measures the
// time that passed, does not move.
func TestStepMovesTheWallClockOnly(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := New(start)
	c.Advance(time.Second)
	c.Step(time.Hour)
	if got, want := c.Now(), start.Add(time.Hour+time.Second); !got.Equal(want) {
		t.Errorf("Now after a step of 1h = %s, want %s", got, want)
	}
	if got, want := c.Mono(), start.Add(time.Second); !got.Equal(want) {
		t.Errorf("Mono after a step of 1h = %s, want %s (unmoved)", got, want)
	}
	c.Step(-2 * time.Hour)
	c.Advance(time.Second)
	if got, want := c.Now(), start.Add(-time.Hour+2*time.Second); !got.Equal(want) {
		t.Errorf("Now after a step back of 2h = %s, want %s", got, want)
	}
	if got, want := c.Mono(), start.Add(2*time.Second); !got.Equal(want) {
		t.Errorf("Mono after a step back = %s, want %s", got, want)
	}
}
