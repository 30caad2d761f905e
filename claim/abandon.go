package claim

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/outboxrelay/outbox/events"
)

// abandonSettle is how long after a failed claim its lease is released
// again: a server that went on with the claim's update after the client
// gave up (FerretDB applies an update document by document) may still be
// writing it when the first release runs.
const abandonSettle = time.Second

// abandonedLeases are the leases of claims whose write failed part-way.
// The server may have claimed some events for such a lease before the
// error; nothing of it was published, so they go back to NEW with their
// attempt refunded, at once and again once abandonSettle has passed,
// rather than wait for recovery and lose an attempt each time. After the
// stale threshold recovery owns them and the lease is forgotten.
type abandonedLeases struct {
	staleAfter time.Duration

	mu      sync.Mutex // runOnce and a Stop that gave up on it may overlap
	pending []abandoned
}

type abandoned struct {
	lease    events.Lease
	failedAt time.Time
}

func (a *abandonedLeases) add(lease events.Lease, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pending = append(a.pending, abandoned{lease: lease, failedAt: now})
}

// retry releases what each pending lease holds, and forgets a lease once
// a release after abandonSettle succeeded or recovery owns its events.
func (a *abandonedLeases) retry(ctx context.Context, store Store, now time.Time, logger *slog.Logger) {
	a.mu.Lock()
	defer a.mu.Unlock()
	kept := a.pending[:0]
	for _, p := range a.pending {
		if now.Sub(p.lease.At) >= a.staleAfter {
			continue
		}
		releaseCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		n, err := store.Abandon(releaseCtx, p.lease)
		cancel()
		switch {
		case err != nil:
			logger.Warn("could not release the events of a failed claim; recovery will", "error", err)
		case n > 0:
			logger.Info("released the events a failed claim had taken", "count", n)
		}
		if err != nil || now.Sub(p.failedAt) < abandonSettle {
			kept = append(kept, p)
		}
	}
	a.pending = kept
}
