package inbox

import (
	"sync"
	"time"

	"github.com/google/go-cmp/cmp"
)

// metricsSpy counts the calls of the Metrics it makes, by name (and
// reason), from any goroutine.
type metricsSpy struct {
	mu    sync.Mutex
	calls map[string]int
}

func (s *metricsSpy) add(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.calls == nil {
		s.calls = map[string]int{}
	}
	s.calls[name]++
}

func (s *metricsSpy) metrics() Metrics {
	return Metrics{
		Processed:    func() { s.add("processed") },
		Duplicate:    func() { s.add("duplicate") },
		HandlerError: func() { s.add("handler_error") },
		Rejected:     func(reason string) { s.add("rejected " + reason) },
		Handled:      func(time.Duration) { s.add("handled") },
		Expired:      func(int64) { s.add("expired") },
	}
}

// diff is want against the calls so far, as cmp.Diff says it.
func (s *metricsSpy) diff(want map[string]int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return cmp.Diff(want, s.calls)
}
