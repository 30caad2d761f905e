// Package fakeclock is a clock that tests move by hand, for code that takes
// its time from a func() time.Time, so that deadlines pass when a test says.
//
// A real clock is two clocks: the wall clock, which an NTP step or an
// operator's date command sets forward or back, and the monotonic clock,
// which only runs. time.Now carries both readings, and Sub, Before and
// After between two such times use the monotonic one, so code that only
// measures intervals on time.Now never sees a step. A Clock models both:
// Advance is time passing (both move), Step is the wall clock being set
// (only the wall moves). Now is the wall reading; Mono is a time that moves
// with the monotonic clock alone, for code that takes func() time.Time only
// to measure intervals (as time.Now's monotonic reading would).
package fakeclock

import (
	"sync"
	"time"
)

// Clock is a time that moves only by Advance and Step. It is safe for
// concurrent use: the code under test may read it from its own goroutines.
type Clock struct {
	mu    sync.Mutex
	start time.Time
	// ran is the time that has passed since start (every Advance), and
	// stepped how far the wall clock was set besides (every Step).
	ran, stepped time.Duration
}

// New returns a Clock standing at start.
func New(start time.Time) *Clock { return &Clock{start: start} }

// Now returns the wall clock's time: start, moved by every Advance and every
// Step. Pass the method value (clock.Now) where a func() time.Time is
// wanted.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.start.Add(c.ran + c.stepped)
}

// Mono returns the monotonic clock's reading as a time: start moved by
// every Advance, never by a Step. Intervals between two Mono readings are
// the time that passed, whatever the wall clock did.
func (c *Clock) Mono() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.start.Add(c.ran)
}

// Advance lets d pass: both the wall and the monotonic clock move forward.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ran += d
}

// Step sets the wall clock forward by d (back, if d is negative), as an NTP
// step or an operator would; no time passes, and Mono does not move.
func (c *Clock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stepped += d
}
