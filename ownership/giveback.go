package ownership

// Giving partitions back: to balance the replicas, while the broker is not
// ready, and on a clean stop (Release).

import (
	"context"
	"fmt"
	"time"
)

// release gives partitions back by inserting their next term, expired as
// it is written. The write lock keeps claims out until the partitions are
// no longer this replica's. A release that loses means the partition was
// already taken.
//
// A partition in which a claim write of this replica may still land (it
// ended without an answer less than a Margin ago, see Wrote) is given
// back for later: its released term expires doubtMargins Margins after
// the release, and the others take it a Margin before that (isFree), two
// Margins after the release by their clocks: one for the tail of the
// write, one for the two replicas' clock errors. Freed at once, a new
// owner could read two events of an aggregate NEW, the late write take
// the first, and the new owner claim and publish the second ahead of it.
func (m *Manager) release(ctx context.Context, ps []int, serverNow time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	terms := make([]Term, 0, len(ps))
	var later []int
	now := m.cfg.Local()
	for _, p := range ps {
		if h, ok := m.owned[p]; ok {
			m.sawHeld(m.claimsUntil(h, now))
			delete(m.owned, p)
			expires := serverNow
			if m.inDoubt(p, now) {
				expires = serverNow.Add(doubtMargins * m.cfg.Margin)
				later = append(later, p)
			}
			terms = append(terms, Term{Partition: p, Term: h.term + 1, Owner: m.cfg.WorkerID, ExpiresAt: expires, Released: true})
		}
	}
	if len(later) > 0 {
		m.cfg.Logger.Warn("partitions given back for later: a claim write in them may still land; they are free two margins after the give-back",
			"partitions", later, "margin", m.cfg.Margin.String())
	}
	if len(terms) == 0 {
		return nil
	}
	// Claims wait on the lock (Hold): the insert gets a deadline, a third
	// of a term. A release that gives up is safe, only slower to hand the
	// partitions over.
	ctx, cancel := context.WithTimeout(ctx, m.cfg.TermLength/3)
	defer cancel()
	if _, err := m.table.Insert(ctx, terms); err != nil {
		// Not claimed in any more either way; the terms expire.
		return fmt.Errorf("give back %d partitions: %w", len(terms), err)
	}
	m.cfg.Logger.Info("partitions given back to balance the replicas", "partitions", len(terms))
	return nil
}

// Release gives back every partition this replica holds and removes its
// heartbeat, so that the others take its share at once rather than after
// its terms run out: for a clean stop, after the last claim and with the
// ticks stopped.
func (m *Manager) Release(ctx context.Context) error {
	if ps := m.Owned(); len(ps) > 0 {
		if err := m.release(ctx, ps, m.cfg.Now()); err != nil {
			return err
		}
	}
	if m.beatAt.IsZero() {
		return nil // no heartbeat written: nothing to remove
	}
	if err := m.table.Prune(ctx, nil, []string{m.cfg.WorkerID}); err != nil {
		return fmt.Errorf("remove heartbeat: %w", err)
	}
	m.beatAt, m.led, m.quiet = time.Time{}, false, 0
	m.cfg.Metrics.PartitionsOwned.Set(0)
	return nil
}

// doubtMargins is how many Margins past the give-back a released term
// with a claim write in doubt expires (see release).
const doubtMargins = 3

// dropFenced forgets the partitions whose claims the database's fence
// refused (Wrote) and returns the terms that give them back: numbered at
// the fence's tenure where it is above the term held, so that the next
// owner's term, whoever takes it, is numbered above the fence. After the
// owners collection was dropped, terms restart at 1 below the fences, and
// a holder renewing them had every claim refused for good. The fence
// refused every write of the tenure held, so no claim write of it can
// land: the partitions are free at once. Call with mu held.
func (m *Manager) dropFenced(serverNow time.Time) []Term {
	var terms []Term
	now := m.cfg.Local()
	for p, h := range m.owned {
		f := m.fenceOf(p)
		if f <= h.since {
			continue
		}
		m.sawHeld(m.claimsUntil(h, now))
		delete(m.owned, p)
		terms = append(terms, Term{Partition: p, Term: max(h.term+1, f), Owner: m.cfg.WorkerID, ExpiresAt: serverNow, Released: true})
	}
	return terms
}

// giveBackFenced inserts the terms dropFenced returned, and records those
// won in latest, where the round's takes find them free.
func (m *Manager) giveBackFenced(ctx context.Context, terms []Term, latest map[int]Term) error {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.TermLength/3)
	defer cancel()
	won, err := m.table.Insert(ctx, terms)
	if err != nil {
		return fmt.Errorf("give back %d partitions the database's fence refused: %w", len(terms), err)
	}
	ps := make([]int, 0, len(terms))
	for i, t := range terms {
		if won[i] {
			latest[t.Partition] = t
		}
		ps = append(ps, t.Partition)
	}
	m.cfg.Logger.Warn("partitions dropped: the database's fence refused their claims; their next term is numbered above the fence",
		"partitions", ps)
	return nil
}
