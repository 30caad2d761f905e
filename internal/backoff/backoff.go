// Package backoff is the one exponential backoff of the worker: broker
// reconnects, database waits, outcome-write retries, change-stream reopens,
// schedule ticks after failures and publish retries all double a delay from
// a floor to a cap, and most spread it with jitter so that replicas do not
// act in step.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Delay is the n-th delay (n from 0) of a backoff that starts at min and
// doubles up to max.
func Delay(n int, min, max time.Duration) time.Duration {
	d := min
	for range n {
		if d >= max/2 {
			return max
		}
		d *= 2
	}
	return d
}

// Jitter spreads d over [d/2, d], so that replicas that failed together do
// not retry together.
func Jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}

// Backoff hands out the delays of one retry loop: Next doubles the delay
// from Min up to Max, Reset starts again from Min. The zero value is not
// usable; set Min and Max.
type Backoff struct {
	Min, Max time.Duration
	// Jitter spreads each delay over [d/2, d].
	Jitter bool

	n int
}

// Next is the delay before the next attempt.
func (b *Backoff) Next() time.Duration {
	d := Delay(b.n, b.Min, b.Max)
	b.n++
	if b.Jitter {
		d = Jitter(d)
	}
	return d
}

// Reset makes the next delay Min again, after a success.
func (b *Backoff) Reset() { b.n = 0 }

// Sleep waits d or until ctx ends, and reports whether it waited all of d.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
