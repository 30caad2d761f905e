package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/workerproc"
)

// shareScenario: workers relay a backlog of n with ordering on (the
// default); partitions divide the work, so no event is claimed twice, not
// even on FerretDB, and every worker publishes a share.
//
// On FerretDB the backlog is written before the workers start and lasts
// long after their partitions have settled. MongoDB relays it in moments,
// before ownership could settle, so there the workers start first and the
// backlog arrives as a stream, insertChunk every sharePace.
func shareScenario(t *testing.T, s stack, workers, n int) {
	const sharePace = 250 * time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout(n))
	defer cancel()
	db, coll, exchange, r := s.relayed(t)

	var ids []string
	if !s.atomicClaims {
		ids = insertBacklog(ctx, t, coll, n, "e2e.shared")
	}
	procs := make([]*workerproc.Proc, workers)
	for i := range procs {
		id := fmt.Sprintf("%s-w%d", db.Name(), i)
		procs[i] = startWorker(t, id, s.relayEnv(db.Name(), exchange, id))
	}
	if s.atomicClaims {
		tick := time.NewTicker(sharePace)
		for len(ids) < n {
			ids = append(ids, insertBacklog(ctx, t, coll, min(insertChunk, n-len(ids)), "e2e.shared")...)
			select {
			case <-ctx.Done():
				t.Fatalf("inserting the stream: %v", ctx.Err())
			case <-tick.C:
			}
		}
		tick.Stop()
	}
	explained(t, coll, func() { r.waitDistinct(ctx, t, n) })
	waitCount(ctx, t, coll, bson.D{{Key: events.FieldStatus, Value: events.StatusPublished}}, int64(n))
	stopWorkers(t, procs...)
	r.drain(t)

	r.checkExactly(t, ids)
	distinct, total, _ := r.Snapshot()
	if dups := total - distinct; dups != 0 {
		t.Errorf("%d duplicate deliveries of %d events, want none: replicas that own disjoint partitions never claim the same event", dups, n)
	}
	// Each PUBLISHED document keeps the id of the worker that marked it.
	for _, p := range procs {
		c := publishedBy(ctx, t, coll, p)
		t.Logf("%s published %d of %d events", p.Name(), c, n)
		if share := int64(n / (workers * 10)); c < share {
			t.Errorf("%s published %d of %d events, want at least %d (a tenth of an even share)", p.Name(), c, n, share)
		}
	}
}
