package ownership

// Renewals: on a schedule of their own, in a round, or for a claim (Renew),
// serialized, each inserting the next term of every partition held.

import (
	"context"
	"errors"
	"fmt"
)

// renewalChecks is how many times per round the renewals job checks
// whether a renewal is due: a check is local, and the finer they come the
// sooner after it falls due a renewal starts.
const renewalChecks = 4

// renewalRun renews the partitions held once a renewal is due, apart from
// the rounds. Through a slow database a round's read, heartbeat and takes
// each cost a round trip, and a renewal that waited for the round let
// terms run out: with commands at a tenth of a term, a round that ran a
// third of a term over put the renewal past the deadline. On its own
// schedule a renewal waits for nothing but its own insert and check read.
// A failed renewal is counted with the rounds' errors; the next check
// tries again.
func (m *Manager) renewalRun(ctx context.Context) (bool, error) {
	if m.stopped.Load() || !m.renewalDue() {
		return false, nil
	}
	if m.cfg.Synced != nil && !m.cfg.Synced() {
		return false, nil // the round reports it
	}
	// Past two thirds of a term the partitions' deadlines have passed:
	// the round takes them again, if still free.
	ctx, cancel := context.WithTimeout(ctx, 2*m.cfg.TermLength/3)
	defer cancel()
	renewed, err := m.renew(ctx, m.now())
	if err != nil && !errors.Is(err, context.Canceled) {
		m.cfg.Metrics.JobErrors.WithLabelValues("ownership").Inc()
		return false, err
	}
	if renewed {
		m.renewedBeat.Store(true)
	}
	return false, nil
}

// errStopped is Renew's answer once the Manager is stopping: its terms
// are left to run out or be released, not renewed.
var errStopped = errors.New("ownership stopped")

// renew inserts the next term of every partition held once any of them is
// less than two thirds of a term from its deadline (see renewalDue). They
// are renewed together so that their deadlines stay together: partitions
// taken in different rounds would otherwise each cost an insert, and its
// check read, on a schedule of their own.
func (m *Manager) renew(ctx context.Context, at instant) (renewed bool, err error) {
	m.renewing.Lock()
	defer m.renewing.Unlock()
	if !m.renewalDue() {
		return false, nil
	}
	return true, m.renewHeld(ctx, at)
}

// Renew renews every partition held now, due or not: for a claim whose
// write needs more time than Hold has left (see the claim package). The
// new terms run from the server's time as this call reads it. Call it
// without a Hold in progress: the insert takes the write lock. The new
// deadlines count from the local instant read together with that server
// time, just before the insert.
//
// A renewal that succeeded while Renew waited for another's to end (the
// renewals job's, or a round's) started no earlier than about one
// renewal before this call, and its validity serves the claim: Renew then
// returns at once, and the claim's next Hold sees it.
func (m *Manager) Renew(ctx context.Context) error {
	return m.renewSince(ctx, m.renewed.Load())
}

// renewSince is Renew, by then before renewals had succeeded.
func (m *Manager) renewSince(ctx context.Context, before int64) error {
	if m.stopped.Load() {
		return errStopped
	}
	m.renewing.Lock()
	defer m.renewing.Unlock()
	if m.renewed.Load() != before {
		return nil
	}
	if m.cfg.Synced != nil && !m.cfg.Synced() {
		return ErrClockUnsynced
	}
	// The renewal lock is held across the insert: without a deadline, a
	// connection that stopped answering would hold the renewals job and
	// the rounds behind it for good. A third of a term is when the next
	// renewal falls due anyway.
	ctx, cancel := context.WithTimeout(ctx, m.cfg.TermLength/3)
	defer cancel()
	return m.renewHeld(ctx, m.now())
}

// renewHeld inserts the next term of every partition held, expiring a
// term after at. Call it with renewing held.
func (m *Manager) renewHeld(ctx context.Context, at instant) error {
	m.mu.RLock()
	terms := make([]Term, 0, len(m.owned))
	now := m.cfg.Local()
	for p, h := range m.owned {
		if !h.deadline.After(now) {
			continue // ran out: the round drops it, and takes it again if free
		}
		terms = append(terms, Term{Partition: p, Term: h.term + 1, Owner: m.cfg.WorkerID, ExpiresAt: at.server.Add(m.cfg.TermLength)})
	}
	m.mu.RUnlock()
	if len(terms) == 0 {
		return nil
	}
	won, err := m.insert(ctx, terms, at.local)
	if err != nil {
		return fmt.Errorf("renew %d partitions: %w", len(terms), err)
	}
	m.renewed.Add(1)
	if lost := len(terms) - won; lost > 0 {
		m.cfg.Logger.Warn("partitions lost at renewal: another worker took them after their term ran out", "lost", lost)
	}
	return nil
}

// renewalDue reports whether a third of a term has passed since a
// partition held was renewed: its deadline, a term less the Margin after
// the renewal's instant, is less than two thirds of a term less the
// Margin away (10 s after the last renewal by default). The interval
// counts from the renewal's start, not its end: counted from its end, a
// renewal that takes longer than a third of a term less a Margin (two
// round trips at +600 ms through a 5 s term) was due again the moment it
// returned, and renewals ran back to back. Renewing later would save
// inserts but shorten the validity a claim's writes get just before a
// renewal (Hold).
func (m *Manager) renewalDue() bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	now := m.cfg.Local()
	for _, h := range m.owned {
		if h.deadline.Sub(now) < 2*m.cfg.TermLength/3-m.cfg.Margin {
			return true
		}
	}
	return false
}
