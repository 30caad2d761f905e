package backoff

import (
	"context"
	"testing"
	"time"
)

func TestDelay(t *testing.T) {
	t.Parallel()
	// The delay doubles from 100 ms to the cap of a second, and stays
	// there, without overflow, however long the outage.
	for n, want := range map[int]time.Duration{
		0:  100 * time.Millisecond,
		1:  200 * time.Millisecond,
		3:  800 * time.Millisecond,
		4:  time.Second,
		60: time.Second,
	} {
		if got := Delay(n, 100*time.Millisecond, time.Second); got != want {
			t.Errorf("Delay(%d) = %s, want %s", n, got, want)
		}
	}
}

func TestJitterStaysInRange(t *testing.T) {
	t.Parallel()
	for range 1000 {
		if d := Jitter(time.Second); d < 500*time.Millisecond || d > time.Second {
			t.Fatalf("Jitter(1s) = %s, want [500ms, 1s]", d)
		}
	}
	if d := Jitter(0); d != 0 {
		t.Errorf("Jitter(0) = %s", d)
	}
}

func TestBackoffNextAndReset(t *testing.T) {
	t.Parallel()
	b := Backoff{Min: time.Second, Max: 4 * time.Second}
	var got []time.Duration
	for range 4 {
		got = append(got, b.Next())
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("delays %v, want %v", got, want)
		}
	}
	b.Reset()
	if d := b.Next(); d != time.Second {
		t.Errorf("after Reset Next = %s, want 1s", d)
	}
}

func TestSleepEndsWithContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Error("Sleep waited although its context had ended")
	}
	if !Sleep(context.Background(), time.Millisecond) {
		t.Error("Sleep did not wait 1ms")
	}
}
