package claim

import (
	"sync/atomic"
	"time"
)

// idleSince is since when claims have found nothing, for the schedule's
// back-off (schedule.Config.IdleSince), and the sampler's. Only a claim
// that read the outbox and found nothing starts or keeps it: one that
// waited for the broker, owned nothing or failed ends it, so that a relay
// that is blocked rather than idle keeps its gauges sampled (its failed
// runs are spaced by the schedule's failure back-off; the others read
// nothing).
type idleSince struct{ at atomic.Int64 } // unix nanoseconds; 0 while claims find events

// note records a claim that read the outbox at now: empty when it found
// nothing to take.
func (s *idleSince) note(empty bool, now time.Time) {
	if !empty {
		s.at.Store(0)
		return
	}
	s.at.CompareAndSwap(0, now.UnixNano())
}

// get is since when claims have found nothing; zero while they find events.
func (s *idleSince) get() time.Time {
	n := s.at.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}
