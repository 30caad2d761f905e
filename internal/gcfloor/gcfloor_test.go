package gcfloor

import (
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	for _, tt := range []struct {
		name               string
		base               int
		floor, live, roots uint64
		want               int
	}{
		{"small heap: goal at the floor", 100, 16 * mib, 4 * mib, 0, 300},
		{"small heap with roots", 100, 16 * mib, 3 * mib, 1 * mib, 325},
		{"tiny heap: bounded", 100, 16 * mib, 1, 0, maxPercent},
		{"heap at half the floor: as found", 100, 16 * mib, 8 * mib, 0, 100},
		{"heap at the floor: as found", 100, 16 * mib, 16 * mib, 0, 100},
		{"large heap: as found", 100, 16 * mib, 300 * mib, mib, 100},
		{"base already above", 500, 16 * mib, 4 * mib, 0, 500},
		{"nothing live yet", 100, 16 * mib, 0, mib, 100},
	} {
		got := Percent(tt.base, tt.floor, tt.live, tt.roots)
		if got != tt.want {
			t.Errorf("%s: Percent(%d, %d, %d, %d) = %d, want %d", tt.name, tt.base, tt.floor, tt.live, tt.roots, got, tt.want)
		}
		// The goal the runtime derives from it is never below the
		// floor (save for the bound) nor below the one base gives.
		goal := func(p int) uint64 { return tt.live + (tt.live+tt.roots)*uint64(p)/100 }
		if got < maxPercent && tt.live > 0 && goal(got) < min(tt.floor, goal(maxPercent))-mib/100 {
			t.Errorf("%s: heap goal %d, below the floor %d", tt.name, goal(got), tt.floor)
		}
		if goal(got) < goal(tt.base) {
			t.Errorf("%s: heap goal %d, below the %d that GOGC %d gives", tt.name, goal(got), goal(tt.base), tt.base)
		}
	}
}

// churn allocates garbage until the collector has run a few times.
func churn() {
	var n runtime.MemStats
	runtime.ReadMemStats(&n)
	start := n.NumGC
	for i := 0; ; i++ {
		sink = make([]byte, 64<<10)
		if i%256 == 0 {
			runtime.ReadMemStats(&n)
			if n.NumGC >= start+3 {
				return
			}
		}
	}
}

var sink []byte

// waitTunes churns until the Floor has retuned GOGC after n more
// collections, and returns the GOGC it set.
func waitTunes(t *testing.T, f *Floor, n int) int {
	t.Helper()
	f.mu.Lock()
	want := f.tunes + n
	f.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		churn()
		f.mu.Lock()
		tunes, p := f.tunes, f.percent
		f.mu.Unlock()
		if tunes >= want {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Floor ran %d times in 10 s of collections, want %d", tunes, want)
		}
	}
}

// The tests below change the process's GOGC, so none runs in parallel.

func TestFloorRaisesGOGCForASmallHeap(t *testing.T) {
	f := Start(256 << 20)
	if f == nil {
		t.Skip("GOGC=off in this test process")
	}
	defer f.Stop()
	if p := waitTunes(t, f, 2); p <= 100 {
		t.Fatalf("GOGC %d with a small heap under a floor of 256 MiB, want above 100", p)
	}
	if got := debug.SetGCPercent(f.Percent()); got != f.Percent() {
		t.Errorf("the runtime's GOGC is %d, the Floor says %d", got, f.Percent())
	}
	f.Stop()
	f.Stop()
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("GOGC after Stop = %d, want 100 as found", got)
	}
}

func TestFloorLeavesALargeHeapAlone(t *testing.T) {
	live := make([][]byte, 64)
	for i := range live {
		live[i] = make([]byte, 128<<10) // 8 MiB held across the collections
	}
	f := Start(1 << 20)
	if f == nil {
		t.Skip("GOGC=off in this test process")
	}
	defer f.Stop()
	if p := waitTunes(t, f, 3); p != 100 {
		t.Errorf("GOGC %d with 8 MiB live over a floor of 1 MiB, want 100 as found", p)
	}
	runtime.KeepAlive(live)
}

func TestStopOnNil(t *testing.T) {
	var f *Floor
	f.Stop()
}
