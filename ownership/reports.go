package ownership

// What the claims report to the ownership: a claim the database's fence
// refused (its partition is dropped, and its next term numbered above the
// fence).

import (
	"errors"
	"sync"

	"github.com/outboxrelay/outbox/events"
)

// notes is what Wrote learned. Its lock is taken inside
// mu, never the other way round: Wrote is called while a claim's Hold is
// in progress.
type notes struct {
	mu sync.Mutex
	// fences holds, per partition, the highest tenure the database's
	// fence refused this replica's claims under a later one of: the next
	// term of it is numbered above.
	fences map[int]int64
}

// Wrote is told how a claim's write in partitions ended (claim.Owner). An
// *events.FencedError, from a claim's write or its
// read, names partitions another worker holds under a later tenure: Hold
// stops returning them at once, the next round drops them, gives them
// back under a term numbered at the fence's tenure, and every term this
// replica takes of them after is numbered above it.
func (m *Manager) Wrote(partitions []int, err error) {
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
}

// fenceOf returns the tenure the database's fence refused this replica
// under a later one of in partition p, 0 if none.
func (m *Manager) fenceOf(p int) int64 {
	m.notes.mu.Lock()
	defer m.notes.mu.Unlock()
	return m.notes.fences[p]
}
