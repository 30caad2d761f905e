package ownership

import (
	"context"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/outboxrelay/outbox/events"
)

// Term is one term of one partition's ownership.
type Term struct {
	Partition int
	Term      int64
	Owner     string
	// ExpiresAt is when the term ends, by the database server's clock.
	ExpiresAt time.Time
	// Released marks a term its owner inserted to give the partition
	// away: it expires as it is written.
	Released bool
}

// ID is the term's unique _id, "<partition>/<term>": two inserts of the
// same term cannot both win.
func (t Term) ID() string { return fmt.Sprintf("%d/%d", t.Partition, t.Term) }

// Member is one replica's heartbeat.
type Member struct {
	WorkerID string
	// SeenAt is the server's time of its last heartbeat.
	SeenAt time.Time
}

// Table is the owners collection as a Manager needs it.
type Table interface {
	// Read returns every term and every member.
	Read(ctx context.Context) ([]Term, []Member, error)
	// Insert inserts each term with a unique insert and reports which it
	// won; a term whose _id exists is lost, never an error.
	Insert(ctx context.Context, terms []Term) (won []bool, err error)
	// Heartbeat records that m is alive. Only m's own worker writes it.
	Heartbeat(ctx context.Context, m Member) error
	// Prune deletes terms and members that no decision needs any more.
	Prune(ctx context.Context, terms []Term, members []string) error
}

// Latest returns each partition's latest term.
func Latest(terms []Term) map[int]Term {
	out := make(map[int]Term, events.Partitions)
	for _, t := range terms {
		if cur, ok := out[t.Partition]; !ok || t.Term > cur.Term {
			out[t.Partition] = t
		}
	}
	return out
}

// Live counts the replicas sharing the work at serverNow: me, the members
// heard from within a term, and the owners of terms not yet expired.
func Live(me string, latest map[int]Term, members []Member, serverNow time.Time, termLength, margin time.Duration) int {
	live := map[string]bool{me: true}
	for _, mb := range members {
		if !serverNow.After(mb.SeenAt.Add(termLength + margin)) {
			live[mb.WorkerID] = true
		}
	}
	for _, t := range latest {
		if !t.Released && !serverNow.After(t.ExpiresAt.Add(margin)) {
			live[t.Owner] = true
		}
	}
	return len(live)
}

// Share is the most partitions one of live replicas aims to own.
func Share(live int) int {
	live = max(live, 1)
	return (events.Partitions + live - 1) / live
}

// Prunable returns the terms older than the one before each partition's
// latest, and the members silent for longer than forget.
func Prunable(terms []Term, members []Member, serverNow time.Time, forget time.Duration) (old []Term, gone []string) {
	latest := Latest(terms)
	for _, t := range terms {
		if t.Term < latest[t.Partition].Term-1 {
			old = append(old, t)
		}
	}
	for _, mb := range members {
		if serverNow.Sub(mb.SeenAt) > forget {
			gone = append(gone, mb.WorkerID)
		}
	}
	return old, gone
}

func hash(s string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return h.Sum32()
}

// anyFree reports whether a partition is free: one that some replica
// should take.
func anyFree(latest map[int]Term, serverNow time.Time, margin time.Duration) bool {
	for p := range events.Partitions {
		t, ok := latest[p]
		if isFree(t, ok, serverNow, margin) {
			return true
		}
	}
	return false
}

// isFree reports whether a partition whose latest term is t (ok: it has
// one) may be taken at serverNow: it has no term, its term ended more than
// margin ago, or its owner gave it back and the release's expiresAt is
// less than margin away. A release expires as it is written, so it is free
// at once, whatever the two clocks' small errors: its owner stopped
// claiming in it before it wrote the release, under the lock that waits
// for its claims. A release with a claim write in doubt expires later (see
// Manager.release), and is free a margin before that.
func isFree(t Term, ok bool, serverNow time.Time, margin time.Duration) bool {
	return !ok || serverNow.After(t.ExpiresAt.Add(margin)) || (t.Released && !serverNow.Add(margin).Before(t.ExpiresAt))
}
