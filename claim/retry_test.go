package claim

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// noJitter keeps every delay at its full length.
func noJitter(time.Duration) time.Duration { return 0 }

// fullJitter takes the most randomJitter may: all of the half it is given.
func fullJitter(d time.Duration) time.Duration { return d }

func TestRetryDelay(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		n      int
		lo, hi time.Duration
		jitter func(time.Duration) time.Duration
		want   time.Duration
	}{
		{"first retry waits min", 1, time.Second, 5 * time.Minute, noJitter, time.Second},
		{"second doubles", 2, time.Second, 5 * time.Minute, noJitter, 2 * time.Second},
		{"third doubles again", 3, time.Second, 5 * time.Minute, noJitter, 4 * time.Second},
		{"ninth below the cap", 9, time.Second, 5 * time.Minute, noJitter, 256 * time.Second},
		{"tenth capped at max", 10, time.Second, 5 * time.Minute, noJitter, 5 * time.Minute},
		{"far past the cap stays at max", 1000, time.Second, 5 * time.Minute, noJitter, 5 * time.Minute},
		{"zero attempts waits min", 0, time.Second, 5 * time.Minute, noJitter, time.Second},
		{"min equals max", 7, 3 * time.Second, 3 * time.Second, noJitter, 3 * time.Second},
		{"full jitter halves the first", 1, time.Second, 5 * time.Minute, fullJitter, 500 * time.Millisecond},
		{"full jitter halves the cap", 20, time.Second, 5 * time.Minute, fullJitter, 150 * time.Second},
		{"jitter subtracts what it returns", 2, time.Second, time.Minute,
			func(time.Duration) time.Duration { return 300 * time.Millisecond }, 1700 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := retryDelay(tt.n, tt.lo, tt.hi, tt.jitter)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("retryDelay(%d, %s, %s) (-want +got):\n%s", tt.n, tt.lo, tt.hi, diff)
			}
		})
	}
}

// TestRetryDelayJitterGetsHalf checks the bound jitter is asked for: half of
// the capped delay, so jitter can shorten a delay by at most half.
func TestRetryDelayJitterGetsHalf(t *testing.T) {
	t.Parallel()
	tests := []struct {
		n    int
		want time.Duration // the argument jitter must get
	}{
		{1, 500 * time.Millisecond},
		{3, 2 * time.Second},
		{30, 30 * time.Second}, // half of the 1m cap
	}
	var got []time.Duration
	for _, tt := range tests {
		retryDelay(tt.n, time.Second, time.Minute, func(d time.Duration) time.Duration {
			got = append(got, d)
			return 0
		})
	}
	want := make([]time.Duration, len(tests))
	for i, tt := range tests {
		want[i] = tt.want
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("jitter arguments (-want +got):\n%s", diff)
	}
}

// TestRetryDelayRandomJitterBounds checks the production jitter: every delay
// lies in [half, whole] of the un-jittered delay.
func TestRetryDelayRandomJitterBounds(t *testing.T) {
	t.Parallel()
	const lo, hi = time.Second, 5 * time.Minute
	for n := 1; n <= 12; n++ {
		full := retryDelay(n, lo, hi, noJitter)
		seen := map[time.Duration]bool{}
		for range 200 {
			d := retryDelay(n, lo, hi, randomJitter)
			if d < full/2 || d > full {
				t.Fatalf("retryDelay(%d) = %s with random jitter, want within [%s, %s]", n, d, full/2, full)
			}
			seen[d] = true
		}
		// 200 draws from a range of at least 250ms in nanoseconds: a jitter
		// that always returned the same value would be no jitter at all.
		if len(seen) < 2 {
			t.Errorf("retryDelay(%d) with random jitter returned one value 200 times: %v", n, seen)
		}
	}
}

func TestRandomJitter(t *testing.T) {
	t.Parallel()
	for _, d := range []time.Duration{-time.Second, 0} {
		if got := randomJitter(d); got != 0 {
			t.Errorf("randomJitter(%s) = %s, want 0", d, got)
		}
	}
	if got := randomJitter(1); got != 0 && got != 1 {
		t.Errorf("randomJitter(1ns) = %s, want 0 or 1ns", got)
	}
	for range 1000 {
		if got := randomJitter(time.Second); got < 0 || got > time.Second {
			t.Fatalf("randomJitter(1s) = %s, want within [0, 1s]", got)
		}
	}
}
