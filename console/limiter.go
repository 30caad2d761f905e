package console

import (
	"sync"
	"time"
)

// limiter allows each key at most max events in a window: the actions of
// one operator, the failed sign-ins of one address. It forgets every key
// when it holds more than limiterKeys, so that a flood of new keys cannot
// grow it without bound.
type limiter struct {
	max    int
	window time.Duration
	now    func() time.Time

	mu   sync.Mutex
	seen map[string]*windowCount
}

type windowCount struct {
	start time.Time
	n     int
}

// limiterKeys bounds the keys a limiter remembers.
const limiterKeys = 10000

func newLimiter(maxPerWindow int, window time.Duration, now func() time.Time) *limiter {
	return &limiter{max: maxPerWindow, window: window, now: now, seen: map[string]*windowCount{}}
}

// allow counts one event of key and reports whether it is within the
// limit.
func (l *limiter) allow(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	w := l.seen[key]
	if w == nil || now.Sub(w.start) >= l.window {
		if len(l.seen) >= limiterKeys {
			l.seen = map[string]*windowCount{}
		}
		w = &windowCount{start: now}
		l.seen[key] = w
	}
	w.n++
	return w.n <= l.max
}

// blocked reports whether key is over the limit now, without counting.
func (l *limiter) blocked(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.seen[key]
	return w != nil && l.now().Sub(w.start) < l.window && w.n >= l.max
}
