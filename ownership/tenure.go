package ownership

// The fence's tenure: what this replica holds of each partition (its term,
// the tenure its unbroken ownership began with, its deadline on the local
// monotonic clock), what a claim may claim in (Hold), and how a won insert
// becomes a holding (insert).

import (
	"context"
	"slices"
	"time"

	"github.com/outboxrelay/outbox/events"
)

// held is a partition this replica owns.
type held struct {
	term int64
	// since is the term this replica's unbroken ownership began with: a
	// renewal keeps it, a partition lost and taken again gets a new one.
	// Hold returns it, so that a claim whose read and write straddle a
	// renewal still writes in the partition.
	since int64
	// deadline is when this replica stops claiming in it, on Local: a
	// term less the Margin after the local instant read together with the
	// server time its expiresAt was computed from (see instant).
	deadline time.Time
}

// instant is one moment read on both clocks, the local one first: the
// server time a term's expiresAt is computed from, and a local instant no
// later than it, which the owner's deadline counts from. Whatever happens
// between it and the insert (the heartbeat, waiting for the write lock
// behind a claim, a release, a slow database) shortens the owner's
// validity instead of extending its belief past expiresAt.
type instant struct{ local, server time.Time }

// now reads the instant.
func (m *Manager) now() instant {
	local := m.cfg.Local()
	return instant{local: local, server: m.cfg.Now()}
}

// Hold returns the tenure of each partition this replica may claim in now
// (Partitions entries, 0 where it may not): the term its unbroken
// ownership began with, which renewals keep. A partition whose claim the
// database's fence refused (Wrote) is not returned. It also returns how long it
// may claim in all of them, and a function to call once the claim's writes
// are done: no partition is given away in between. A partition whose
// deadline is less than Margin away is not returned. A partition whose
// tenure differs between two Holds changed hands in between.
func (m *Manager) Hold() (terms []int64, validFor time.Duration, done func()) {
	m.mu.RLock()
	now := m.cfg.Local()
	terms = make([]int64, events.Partitions)
	validFor = -1
	m.notes.mu.Lock()
	defer m.notes.mu.Unlock()
	for p, h := range m.owned {
		left := h.deadline.Sub(now) - m.cfg.Margin
		if left <= 0 || m.notes.fences[p] > h.since {
			continue // ran out, or the database's fence holds a later tenure
		}
		terms[p] = h.since
		if validFor < 0 || left < validFor {
			validFor = left
		}
	}
	return terms, max(validFor, 0), m.mu.RUnlock
}

// Leads reports whether this replica is the leader now: it may claim in
// LeaderPartition.
func (m *Manager) Leads() bool {
	terms, _, done := m.Hold()
	defer done()
	return terms[LeaderPartition] != 0
}

// LeaderPartition is the partition whose owner is the leader: the one
// replica that does the work done once for all of them (pruning old
// terms here, sampling the backlog gauges in the worker). Leadership moves with the partition, by the same
// unique inserts, so at most one replica leads at a time.
const LeaderPartition = 0

// insert inserts terms, if any, and records those won, with a deadline a
// term less the Margin after from: the local instant read with the server
// time their expiresAt counts from (instant), so no later than it. A lost
// term's partition is forgotten. It returns how many it won.
//
// One read after the insert checks what it did. A won term is kept only
// if no later term of its partition exists: old terms are pruned, so a
// replica that paused between its read and its insert for longer than a
// few terms could otherwise win an _id that was deleted under a newer
// owner (the later term is never pruned). A lost term whose _id is this
// replica's own counts as won: an earlier insert landed although it
// reported an error (a timeout), or its check read failed, and the
// renewal after it must not lose the partition to itself.
func (m *Manager) insert(ctx context.Context, terms []Term, from time.Time) (int, error) {
	if len(terms) == 0 {
		return 0, nil
	}
	won, err := m.table.Insert(ctx, terms)
	// ours are the lost terms whose _id an earlier insert of this replica
	// holds: an insert that landed although it reported an error, or whose
	// check read failed. Losing to itself must not cost a partition.
	var ours map[int]Term
	if err == nil {
		var after []Term
		if after, _, err = m.table.Read(ctx); err == nil {
			latest := Latest(after)
			for i, t := range terms {
				cur := latest[t.Partition]
				switch {
				case won[i] && cur.Term > t.Term:
					m.cfg.Logger.Warn("a term won after a pause is behind a newer owner's; not claiming in it",
						"partition", t.Partition, "term", t.Term, "owner", cur.Owner)
					won[i] = false
				case !won[i] && cur.Term == t.Term && cur.Owner == m.cfg.WorkerID && !cur.Released:
					if ours == nil {
						ours = map[int]Term{}
					}
					ours[t.Partition] = cur
				}
			}
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		return 0, err
	}
	n := 0
	for i, t := range terms {
		if cur, ok := ours[t.Partition]; ok {
			// Its deadline counts from the term's own expiry, not from
			// this insert: the earlier one was sent before.
			left := cur.ExpiresAt.Sub(m.cfg.Now())
			m.owned[t.Partition] = held{term: t.Term, since: m.sinceFor(t), deadline: m.cfg.Local().Add(left - m.cfg.Margin)}
			n++
			continue
		}
		if won[i] {
			m.owned[t.Partition] = held{term: t.Term, since: m.sinceFor(t), deadline: from.Add(m.cfg.TermLength - m.cfg.Margin)}
			n++
		} else if h, ok := m.owned[t.Partition]; ok {
			m.sawHeld(m.claimsUntil(h, m.cfg.Local()))
			delete(m.owned, t.Partition)
		}
	}
	return n, nil
}

// sinceFor is the tenure of t once won: the tenure held on, for a
// renewal, or t's own term. Call with mu held.
func (m *Manager) sinceFor(t Term) int64 {
	if h, ok := m.owned[t.Partition]; ok && h.term == t.Term-1 {
		return h.since // a renewal: ownership goes on unbroken
	}
	return t.Term
}

// dropLost forgets partitions whose latest term is someone else's, or
// whose deadline has passed, with one warning for each kind: a slow
// database lets every partition lapse at once, and 64 lines of it bury
// everything else. Call with mu held.
func (m *Manager) dropLost(latest map[int]Term) {
	now := m.cfg.Local()
	var taken, lapsed []int
	for p, h := range m.owned {
		t, ok := latest[p]
		switch {
		case ok && t.Term > h.term && t.Owner != m.cfg.WorkerID:
			taken = append(taken, p)
		case !h.deadline.After(now):
			lapsed = append(lapsed, p)
		default:
			continue
		}
		m.sawHeld(m.claimsUntil(h, now))
		delete(m.owned, p)
	}
	if len(taken) > 0 {
		slices.Sort(taken)
		m.cfg.Logger.Warn("partitions taken over by another worker", "count", len(taken), "partitions", taken)
	}
	if len(lapsed) > 0 {
		slices.Sort(lapsed)
		m.cfg.Logger.Warn("partitions' terms ran out before their renewal; claiming in them stopped", "count", len(lapsed), "partitions", lapsed)
	}
}
