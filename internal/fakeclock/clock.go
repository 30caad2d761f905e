// Package fakeclock is a clock that tests move by hand, for code that takes
// its time from a func() time.Time, so that deadlines pass when a test says.
package fakeclock

import (
	"sync"
	"time"
)

// Clock is a time that moves only by Advance. It is safe for concurrent
// use: the code under test may read it from its own goroutines.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// New returns a Clock standing at start.
func New(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time. Pass the method value (clock.Now) where a
// func() time.Time is wanted.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
