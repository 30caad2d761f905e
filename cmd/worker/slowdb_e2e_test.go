// A worker process whose every database round trip is slow: the relay
// must slow down with the database, never stop delivering.

package main

import (
	"context"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/internal/testenv"
)

const (
	// slowDBLatency is added to every round trip between the worker and
	// the database, with slowDBStaleAfter as OUTBOX_STALE_AFTER: the
	// harder of the two latency stages of make bench.
	slowDBLatency    = 600 * time.Millisecond
	slowDBStaleAfter = "10s"
	// slowDBEvents is the backlog: more than one batch of 500, so that
	// the worker claims again after a slow batch.
	slowDBEvents = 600
	// slowDBDeadline is generous: at +600 ms a round trip, a healthy
	// worker relays this backlog in well under a minute here.
	slowDBDeadline = 4 * time.Minute
)

// TestRelayThroughSlowDatabase runs one worker at its default settings,
// but for OUTBOX_STALE_AFTER=10s, against a database 600 ms away per
// round trip, and checks that every event of a backlog is delivered.
func TestRelayThroughSlowDatabase(t *testing.T) {
	t.Parallel()
	// Before the adaptive claim it failed: 0 of 600 events in 4 minutes, every claim
	// ending "calculated server-side timeout (0 ms)": the claim's budget
	// is spent before its last round trip.
	s := localStack(t)
	ctx, cancel := context.WithTimeout(t.Context(), slowDBDeadline+time.Minute)
	defer cancel()
	db, coll, exchange, r := s.relayed(t)
	ids := insertBacklog(ctx, t, coll, slowDBEvents, "e2e.slowdb")

	proxied, proxy := testenv.Proxied(t, s.mongoURI)
	proxy.SetLatency(slowDBLatency)
	slow := s
	slow.mongoURI = proxied
	workerID := db.Name() + "-slow"
	env := slow.workerEnv(db.Name(), exchange, workerID)
	// The worker's defaults, but for the stale threshold of the bench stage (slowDBStaleAfter).
	for _, k := range []string{"OUTBOX_CLAIM_SCHEDULE", "OUTBOX_RECOVERY_SCHEDULE", "OUTBOX_PUBLISH_TIMEOUT"} {
		delete(env, k)
	}
	env["OUTBOX_BATCH_SIZE"] = "500"
	env["OUTBOX_STALE_AFTER"] = slowDBStaleAfter
	start := time.Now()
	p := startWorker(t, workerID, env)

	wctx, wcancel := context.WithTimeout(ctx, slowDBDeadline)
	defer wcancel()
	explained(t, coll, func() { r.waitDistinct(wctx, t, slowDBEvents) })
	took := time.Since(start)
	if proxy.Conns() == 0 {
		t.Errorf("no connection through the slow proxy: the worker did not use it")
	}
	stopWorkers(t, p)
	r.drain(t)
	r.checkExactly(t, ids)
	distinct, total, _ := r.Snapshot()
	t.Logf("%d events through a database %s away per round trip in %.1f s (%.0f/s); %d deliveries",
		distinct, slowDBLatency, took.Seconds(), float64(distinct)/took.Seconds(), total)
}
