package console

import (
	"sync"
	"time"
)

// limiter allows each key at most max events in a window: the actions of
// one credential, the failed sign-ins of one network or one user name.
// With grow, a key that reaches its limit is blocked for a window, then
// for twice as long each time it reaches it again (at most
// limiterMaxBlock), so that a slow guesser gains little by waiting. It
// remembers at most limiterKeys keys: past that it forgets the key seen
// least recently that is not blocked, so that a flood of new keys
// (addresses) can neither grow it without bound nor free a blocked key.
type limiter struct {
	max    int
	window time.Duration
	grow   bool
	now    func() time.Time

	mu   sync.Mutex
	seen map[string]*windowCount
}

type windowCount struct {
	start time.Time // the window's start
	n     int       // events in the window
	last  time.Time // the last event
	// until is when a key that reached its limit is let through again
	// (grow); strikes how many times it reached it.
	until   time.Time
	strikes int
}

// Bounds of a limiter.
const (
	// limiterKeys bounds the keys a limiter remembers.
	limiterKeys = 10000
	// limiterMaxBlock bounds a growing block.
	limiterMaxBlock = time.Hour
)

func newLimiter(maxPerWindow int, window time.Duration, now func() time.Time) *limiter {
	return &limiter{max: maxPerWindow, window: window, now: now, seen: map[string]*windowCount{}}
}

// growing makes l block a key that reached its limit for a window,
// doubled at each strike.
func (l *limiter) growing() *limiter {
	l.grow = true
	return l
}

// allow counts one event of key and reports whether it is within the
// limit.
func (l *limiter) allow(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	w := l.seen[key]
	if w == nil {
		l.makeRoom(now)
		w = &windowCount{start: now}
		l.seen[key] = w
	}
	w.last = now
	if l.grow && now.Before(w.until) {
		return false
	}
	if now.Sub(w.start) >= l.window {
		w.start, w.n = now, 0
	}
	w.n++
	if l.grow && w.n >= l.max {
		// This one is within the limit; the next waits out the block.
		w.until = now.Add(min(l.window<<min(w.strikes, 16), limiterMaxBlock))
		w.strikes++
		w.start, w.n = now, 0
	}
	return w.n <= l.max
}

// blocked reports whether key is over the limit now, without counting.
func (l *limiter) blocked(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.blockedAt(l.seen[key], l.now())
}

func (l *limiter) blockedAt(w *windowCount, now time.Time) bool {
	if w == nil {
		return false
	}
	if l.grow {
		return now.Before(w.until)
	}
	return now.Sub(w.start) < l.window && w.n >= l.max
}

// makeRoom forgets keys until one more fits: the one seen least recently
// among those not blocked, or, when all are, the one seen least
// recently. l.mu is held.
func (l *limiter) makeRoom(now time.Time) {
	for len(l.seen) >= limiterKeys {
		var oldest, oldestBlocked string
		var at, atBlocked time.Time
		for k, w := range l.seen {
			if l.blockedAt(w, now) {
				if oldestBlocked == "" || w.last.Before(atBlocked) {
					oldestBlocked, atBlocked = k, w.last
				}
				continue
			}
			if oldest == "" || w.last.Before(at) {
				oldest, at = k, w.last
			}
		}
		if oldest == "" {
			oldest = oldestBlocked
		}
		delete(l.seen, oldest)
	}
}

// size is how many keys l remembers.
func (l *limiter) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.seen)
}
