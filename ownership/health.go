package ownership

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// health is what the rounds tell the rest of the worker about this
// replica's share: a replica that owns nothing relays nothing, and one
// whose rounds fail without anyone noticing stalls the relay silently.
// Times are kept as offsets from epoch on the Local clock, so that they
// keep its monotonic reading and can be updated without a lock.
type health struct {
	epoch time.Time
	// heldAt is the last moment this replica is known to have held a
	// partition it could claim in (0: since the Manager was made).
	heldAt atomic.Int64
	// leaderAt is the last moment a round saw a leader: a term of
	// LeaderPartition, this replica's or another's, not yet over.
	leaderAt atomic.Int64

	mu      sync.Mutex
	lastErr error // of the last round; nil after one that succeeded
}

// since returns t as an offset from epoch.
func (h *health) since(t time.Time) int64 { return int64(t.Sub(h.epoch)) }

// raise moves v forward to at least t.
func raise(v *atomic.Int64, t int64) {
	for {
		cur := v.Load()
		if t <= cur || v.CompareAndSwap(cur, t) {
			return
		}
	}
}

// claimsUntil is when this replica stops claiming in a partition it
// holds as h: its deadline less the Margin, or now if that is later
// than now (it is being given away or forgotten now).
func (m *Manager) claimsUntil(h held, now time.Time) time.Time {
	until := h.deadline.Add(-m.cfg.Margin)
	if until.After(now) {
		return now
	}
	return until
}

// sawHeld records that this replica held a partition until t.
func (m *Manager) sawHeld(t time.Time) { raise(&m.health.heldAt, m.health.since(t)) }

// noteLeader records, from a round's read, whether some replica leads:
// the latest term of LeaderPartition is one that its owner may still
// claim under (not given back, not over by more than the Margin).
func (m *Manager) noteLeader(latest map[int]Term, serverNow time.Time) {
	t, ok := latest[LeaderPartition]
	if ok && !isFree(t, ok, serverNow, m.cfg.Margin) {
		raise(&m.health.leaderAt, m.health.since(m.cfg.Local()))
	}
}

// noteRound keeps a round's outcome: its error for Unowned, counted in
// job_errors_total{job="ownership"}, and the partitions owned after it.
func (m *Manager) noteRound(err error) {
	if errors.Is(err, context.Canceled) {
		return // a stop, not a failure
	}
	if err != nil {
		m.cfg.Metrics.JobErrors.WithLabelValues("ownership").Inc()
	}
	m.health.mu.Lock()
	m.health.lastErr = err
	m.health.mu.Unlock()
	m.cfg.Metrics.PartitionsOwned.Set(float64(m.holds()))
}

// holds counts the partitions this replica may claim in now, and records
// the moment if there are any.
func (m *Manager) holds() int {
	terms, _, done := m.Hold()
	defer done()
	n := 0
	for _, t := range terms {
		if t != 0 {
			n++
		}
	}
	if n > 0 {
		m.sawHeld(m.cfg.Local())
	}
	return n
}

// Unowned reports how long this replica has owned no partition it may
// claim in (0 while it owns one; since the Manager was made if it never
// has), and the error of the last round if that round failed. A replica
// that owns nothing for longer than a term while it can publish relays
// nothing: the rounds cannot write the owners collection, or more
// replicas run than there are partitions.
func (m *Manager) Unowned() (time.Duration, error) {
	m.health.mu.Lock()
	err := m.health.lastErr
	m.health.mu.Unlock()
	if m.holds() > 0 {
		return 0, err
	}
	// Partitions whose deadline passed since the last round: held until
	// then.
	now := m.cfg.Local()
	m.mu.RLock()
	for _, h := range m.owned {
		m.sawHeld(m.claimsUntil(h, now))
	}
	m.mu.RUnlock()
	held := m.health.epoch.Add(time.Duration(m.health.heldAt.Load()))
	return max(now.Sub(held), 0), err
}

// Leaderless reports whether no round has seen a leader for longer than
// a term (counted from the Manager's making): the work one replica does
// for all of them, such as sampling the backlog gauges, is then left
// undone unless every replica does it. A leader that dies is replaced
// within a term and a margin, so this stays false through a handover.
func (m *Manager) Leaderless() bool {
	if m.Leads() {
		return false
	}
	seen := m.health.epoch.Add(time.Duration(m.health.leaderAt.Load()))
	return m.cfg.Local().Sub(seen) > m.cfg.TermLength
}

// TermLength is the length of a term: how long a replica may go without
// a partition before Unowned counts against it.
func (m *Manager) TermLength() time.Duration { return m.cfg.TermLength }
