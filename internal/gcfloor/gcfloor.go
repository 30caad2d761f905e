// Package gcfloor keeps the Go garbage collector from running while the
// heap is small. With GOGC at 100 the collector runs whenever the heap has
// doubled since the last collection; the worker's live heap is a few
// megabytes, so it ran after every few megabytes allocated, a large share
// of the worker's CPU during a drain (measured in docs/performance.md,
// Where the CPU went). After each collection a Floor raises GOGC just enough for the
// next one to wait until the heap reaches the floor, and leaves GOGC as it
// found it once the live heap alone makes a larger goal: a heap of large
// documents is collected exactly as before.
package gcfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// maxPercent bounds the GOGC a Floor sets, whatever the live heap.
const maxPercent = 10_000

// Floor retunes GOGC after each collection; see the package comment.
type Floor struct {
	floor uint64

	mu      sync.Mutex
	base    int // the GOGC found at Start, which a Floor never goes below
	percent int // the GOGC set now
	tunes   int // how many times tune has run
	stopped bool
}

// Start starts a Floor of floor bytes and returns it, or nil when the
// collector is off (GOGC=off), which it then leaves off.
func Start(floor uint64) *Floor {
	base := debug.SetGCPercent(100)
	debug.SetGCPercent(base)
	if base < 0 {
		return nil
	}
	f := &Floor{floor: floor, base: base, percent: base}
	f.tune()
	f.arm()
	return f
}

// sentinel is an object that nothing references: its finalizer runs after
// the next collection. It holds a pointer so that the allocator never
// packs it with other small objects, which would delay the finalizer.
type sentinel struct{ _ *int }

// arm sets the next collection to call tune.
func (f *Floor) arm() {
	runtime.SetFinalizer(&sentinel{}, func(*sentinel) {
		if f.tune() {
			f.arm()
		}
	})
}

// tune sets GOGC from the live heap the last collection left, and reports
// whether the Floor is still running.
func (f *Floor) tune() bool {
	samples := []metrics.Sample{
		{Name: "/gc/heap/live:bytes"},
		{Name: "/gc/scan/stack:bytes"},
		{Name: "/gc/scan/globals:bytes"},
	}
	metrics.Read(samples)
	var v [3]uint64
	for i, s := range samples {
		if s.Value.Kind() == metrics.KindUint64 {
			v[i] = s.Value.Uint64()
		}
	}
	percent := Percent(f.base, f.floor, v[0], v[1]+v[2])
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return false
	}
	f.tunes++
	if percent != f.percent {
		debug.SetGCPercent(percent)
		f.percent = percent
	}
	return true
}

// Percent is the GOGC whose heap goal reaches floor: base where base
// already does, and at most maxPercent. The runtime sets the goal at
// live + (live + roots) * GOGC/100, where roots are the goroutine stacks
// and the globals it scans.
func Percent(base int, floor, live, roots uint64) int {
	if live == 0 || live >= floor {
		return base
	}
	return max(base, int(min((floor-live)*100/(live+roots), maxPercent)))
}

// Percent returns the GOGC the Floor has set.
func (f *Floor) Percent() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.percent
}

// Stop stops retuning and puts GOGC back as Start found it. Safe on a nil
// Floor, and to call twice.
func (f *Floor) Stop() {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.stopped {
		f.stopped = true
		debug.SetGCPercent(f.base)
		f.percent = f.base
	}
}
