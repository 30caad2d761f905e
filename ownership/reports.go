package ownership

// What the claims and the server clock report to the ownership: a claim
// write that may still land (its partitions are not given back while it
// may), a claim the database's fence refused (its partition is dropped,
// and its next term numbered above the fence), and a jump of the server
// clock's offset (every partition is lost for a term).

import (
	"errors"
	"sync"
	"time"

	"github.com/outboxrelay/outbox/events"
)

// notes is what Wrote and ClockJumped learned. Its lock is taken inside
// mu, never the other way round: Wrote is called while a claim's Hold is
// in progress.
type notes struct {
	mu sync.Mutex
	// doubt holds, per partition, the local instant until which a claim
	// write of this replica that ended without an answer may still land.
	doubt map[int]time.Time
	// fences holds, per partition, the highest tenure the database's
	// fence refused this replica's claims under a later one of: the next
	// term of it is numbered above.
	fences map[int]int64
	// jumpedUntil is the local instant until which this replica takes no
	// partition, after a jump of the server clock's offset.
	jumpedUntil time.Time
}

// Wrote is told how a claim's write in partitions ended (claim.Owner). A
// write that failed for any reason but the fence may still be applied by
// the server after its client gave up on it (a timeout, a broken
// connection), until its own deadline (landBy from now, which the driver
// sends as maxTimeMS: an early network error says nothing of when the
// server stops) and a Margin past it, the tail of a write that the time
// fence allows for too, a give-back of those partitions does not free
// them (see release). An *events.FencedError, from a claim's write or its
// read, names partitions another worker holds under a later tenure: Hold
// stops returning them at once, the next round drops them, gives them
// back under a term numbered at the fence's tenure, and every term this
// replica takes of them after is numbered above it.
func (m *Manager) Wrote(partitions []int, landBy time.Duration, err error) {
	if err == nil {
		return
	}
	m.notes.mu.Lock()
	defer m.notes.mu.Unlock()
	var fenced *events.FencedError
	if errors.As(err, &fenced) {
		if m.notes.fences == nil {
			m.notes.fences = map[int]int64{}
		}
		for p, t := range fenced.Fences {
			m.notes.fences[p] = max(m.notes.fences[p], t)
		}
		return
	}
	if errors.Is(err, events.ErrFenced) {
		return // nothing of it was written; without the tenures there is nothing to number above
	}
	// Until the write can no longer land, by its own deadline, and the
	// margin past it.
	until := m.cfg.Local().Add(max(landBy, 0) + m.cfg.Margin)
	if m.notes.doubt == nil {
		m.notes.doubt = map[int]time.Time{}
	}
	for _, p := range partitions {
		if until.After(m.notes.doubt[p]) {
			m.notes.doubt[p] = until
		}
	}
}

// inDoubt reports whether a claim write in partition p may still land.
func (m *Manager) inDoubt(p int, now time.Time) bool {
	m.notes.mu.Lock()
	defer m.notes.mu.Unlock()
	return now.Before(m.notes.doubt[p])
}

// fenceOf returns the tenure the database's fence refused this replica
// under a later one of in partition p, 0 if none.
func (m *Manager) fenceOf(p int) int64 {
	m.notes.mu.Lock()
	defer m.notes.mu.Unlock()
	return m.notes.fences[p]
}

// ClockJumped is told the difference between the server's time a new
// measurement of the server clock found and the time the last one had
// predicted for that moment (mongo.Clock's OnJump). Within the Margin the
// fence's margins cover it. A larger jump counts as losing every
// partition: the terms this replica holds and the others' it sees were
// timed against a server time that moved, so others may see its terms end
// early (a jump ahead on their side) or it may see theirs end early. It
// stops claiming at once and takes no partition for a term, by which time
// a term written before the jump has ended by every clock.
func (m *Manager) ClockJumped(jump time.Duration) {
	if jump <= m.cfg.Margin && jump >= -m.cfg.Margin {
		return
	}
	m.mu.Lock()
	now := m.cfg.Local()
	lost := len(m.owned)
	for p, h := range m.owned {
		m.sawHeld(m.claimsUntil(h, now))
		delete(m.owned, p)
	}
	m.mu.Unlock()
	m.notes.mu.Lock()
	m.notes.jumpedUntil = now.Add(m.cfg.TermLength)
	m.notes.mu.Unlock()
	m.cfg.Logger.Warn("the database clock's offset jumped by more than the margin; claiming stops in every partition and none is taken for a term",
		"jump", jump.String(), "margin", m.cfg.Margin.String(), "partitions", lost)
}

// jumped reports whether a jump of the server clock keeps this replica
// from taking partitions now.
func (m *Manager) jumped(now time.Time) bool {
	m.notes.mu.Lock()
	defer m.notes.mu.Unlock()
	return now.Before(m.notes.jumpedUntil)
}
