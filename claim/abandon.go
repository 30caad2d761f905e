package claim

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/outboxrelay/outbox/events"
)

// abandonSettle is how long after a failed claim its lease is released
// the second time; each release after that waits twice as long as the one
// before, up to the stale threshold. A server that went on with the
// claim's update after the client gave up (FerretDB applies an update
// document by document; MongoDB may still be waiting on a slow disk) may
// still be writing it when the first release runs.
const abandonSettle = time.Second

// abandonForgetAfter, in stale thresholds, is how long a lease whose
// releases keep failing is kept: past it the database has been out of
// reach for so long that recovery, when it runs again, owns the events.
const abandonForgetAfter = 10

// abandonedLeases are the leases of claims whose write failed part-way.
// The server may have claimed some events for such a lease before the
// error, or may yet; nothing of it was published, so they go back to NEW
// with their attempt refunded, at once and again with backoff, rather
// than wait for recovery and lose an attempt each time. The releases go on
// past the stale threshold until one finds nothing: recovery may own the
// events by then, but it yields to slow claims and may be minutes away,
// and the write may land after it ran. A release matches only this
// lease's token, so it never touches an event recovered and claimed again.
type abandonedLeases struct {
	staleAfter time.Duration

	mu      sync.Mutex // runOnce and a Stop that gave up on it may overlap
	pending []abandoned
}

type abandoned struct {
	lease events.Lease
	// keys are the ordering keys of the events the failed write was given:
	// held by this worker's claims until recovery owns the lease's events
	// (see events.ClaimLimit.Held).
	keys []string
	// empty counts the releases in a row, after the first and after the
	// write's own deadline (over), that found nothing to put back. After
	// one the failed write is taken to be over, and its keys are no longer
	// held; after two past the stale threshold the lease is forgotten. A
	// release that finds events starts the count again. A release before
	// the write's deadline proves nothing: the server may still be in the
	// write's read (FerretDB reads, then rewrites each document, and
	// ignores maxTimeMS on an update), however early its error came back.
	empty int
	over  time.Time
	// next is when the lease is released again, and wait how long after
	// that the release after it comes.
	next time.Time
	wait time.Duration
}

// add notes the lease of a claim whose write failed at now, and may land
// until landBy from now (its deadline).
func (a *abandonedLeases) add(lease events.Lease, keys []string, now time.Time, landBy time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pending = append(a.pending, abandoned{lease: lease, keys: keys, next: now, wait: abandonSettle,
		over: now.Add(max(landBy, 0) + abandonSettle)})
}

// held returns the ordering keys of the pending leases' events, nil when
// there are none. A write that failed may still be landing: its events can
// turn PROCESSING after the next claim read which keys are held, and that
// claim must not take a later event of theirs meanwhile. A lease's keys
// are held until a release after the first finds nothing left to put back,
// or until the stale threshold, when recovery may own its events.
func (a *abandonedLeases) held(now time.Time) map[string]bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	var held map[string]bool
	for _, p := range a.pending {
		if p.empty > 0 || now.Sub(p.lease.At) >= a.staleAfter {
			continue
		}
		for _, k := range p.keys {
			if held == nil {
				held = map[string]bool{}
			}
			held[k] = true
		}
	}
	return held
}

// retry releases what each pending lease whose time has come holds, and
// forgets a lease once recovery owns its events.
func (a *abandonedLeases) retry(ctx context.Context, store Store, now time.Time, logger *slog.Logger) {
	a.release(ctx, store, now, logger, false)
}

// flush releases what every pending lease holds, due or not: for a stop,
// after which nothing retries.
func (a *abandonedLeases) flush(ctx context.Context, store Store, now time.Time, logger *slog.Logger) {
	a.release(ctx, store, now, logger, true)
}

func (a *abandonedLeases) release(ctx context.Context, store Store, now time.Time, logger *slog.Logger, all bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	kept := a.pending[:0]
	for _, p := range a.pending {
		age := now.Sub(p.lease.At)
		if age >= abandonForgetAfter*a.staleAfter {
			logger.Warn("gave up releasing the events of a failed claim; recovery resets them", "lease_at", p.lease.At)
			continue
		}
		if !all && now.Before(p.next) {
			kept = append(kept, p)
			continue
		}
		n, err := a.releaseOne(ctx, store, p.lease, age)
		switch {
		case err != nil:
			logger.Warn("could not release the events of a failed claim; trying again", "error", err)
		case n > 0:
			logger.Info("released the events a failed claim had taken", "count", n)
			p.empty = 0
		case p.wait > abandonSettle && !now.Before(p.over): // not the first, and past the write's deadline
			p.empty++
		}
		if age >= a.staleAfter && p.empty >= 2 {
			continue // the write is long over and nothing is left: forget it
		}
		p.next, p.wait = now.Add(p.wait), min(2*p.wait, a.staleAfter)
		kept = append(kept, p)
	}
	a.pending = kept
}

// releaseOne puts back what the lease holds. Until the stale threshold the
// release may take until recovery would own the events: a deadline of its
// own shorter than that only hands them to recovery, which counts an
// attempt against each. Past it, half a threshold. A stop's own deadline
// still bounds it (flush).
func (a *abandonedLeases) releaseOne(ctx context.Context, store Store, lease events.Lease, age time.Duration) (int, error) {
	wait := max(a.staleAfter-age, a.staleAfter/2)
	if d, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(d))
	}
	releaseCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wait)
	defer cancel()
	return store.Abandon(releaseCtx, lease)
}
