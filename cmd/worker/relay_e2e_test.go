// The relay, kill and SIGTERM scenarios: a backlog relayed by worker
// processes, once with a worker killed holding claims, once stopped.

package main

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/internal/workerproc"
)

// relayScenario: workers relay a backlog of n events; every event arrives
// and every document ends PUBLISHED.
func relayScenario(t *testing.T, s stack, workers, n int) {
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout(n))
	defer cancel()
	db, coll, exchange, r := s.relayed(t)

	firstInsert := time.Now()
	ids := insertBacklog(ctx, t, coll, n, "e2e.relayed")
	inserted := time.Now()
	procs := make([]*workerproc.Proc, workers)
	for i := range procs {
		id := fmt.Sprintf("%s-w%d", db.Name(), i)
		procs[i] = startWorker(t, id, s.relayEnv(db.Name(), exchange, id))
	}

	explained(t, coll, func() { r.waitDistinct(ctx, t, n) })
	_, _, last := r.Snapshot()
	waitCount(ctx, t, coll, bson.D{{Key: events.FieldStatus, Value: events.StatusPublished}}, int64(n))
	stopWorkers(t, procs...)
	r.drain(t)

	r.checkExactly(t, ids)
	checkEveryWorkerPublished(ctx, t, coll, procs)
	distinct, total, _ := r.Snapshot()
	dups := total - distinct
	seconds := last.Sub(firstInsert).Seconds()
	t.Logf("%d workers relayed %d events: %d deliveries, %d duplicates; %.1f s from first insert to last receipt (%.1f s inserting)",
		workers, n, total, dups, seconds, inserted.Sub(firstInsert).Seconds())
	fmt.Printf("E2E-FIGURES: backend=%s workers=%d events=%d seconds=%.1f events_per_s=%.0f duplicates=%d insert_seconds=%.1f relay_seconds=%.1f\n",
		s.name, workers, n, seconds, float64(n)/seconds, dups,
		inserted.Sub(firstInsert).Seconds(), last.Sub(inserted).Seconds())
	if s.atomicClaims && dups > 0 {
		t.Errorf("%d duplicate deliveries on MongoDB, want none: claims must be atomic", dups)
	}
}

// killScenario: SIGKILL one of three workers while it holds a claim; the
// others deliver everything once recovery has reset its stale events.
func killScenario(t *testing.T, s stack, n int) {
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout(n)+time.Minute)
	defer cancel()
	db, coll, exchange, r := s.relayed(t)

	ids := insertBacklog(ctx, t, coll, n, "e2e.killed")
	procs := make([]*workerproc.Proc, 3)
	workerIDs := make([]string, len(procs))
	for i := range procs {
		workerIDs[i] = fmt.Sprintf("%s-w%d", db.Name(), i)
		procs[i] = startWorker(t, workerIDs[i], s.workerEnv(db.Name(), exchange, workerIDs[i]))
	}
	victim, victimID := procs[0], workerIDs[0]

	r.waitDistinct(ctx, t, n/5)
	stranded := killHolding(ctx, t, coll, r, victim, victimID, n)
	killedAt := time.Now()
	t.Logf("killed %s holding %d events; %d of %d events received", victimID, len(stranded), r.distinct(), n)

	explained(t, coll, func() { r.waitDistinct(ctx, t, n) })
	recovered := time.Since(killedAt)
	waitCount(ctx, t, coll, bson.D{{Key: events.FieldStatus, Value: events.StatusPublished}}, int64(n))
	stopWorkers(t, procs[1:]...)
	r.drain(t)

	r.checkExactly(t, ids)
	checkEveryWorkerPublished(ctx, t, coll, procs[1:])
	// Each stranded event was claimed by the victim, reset by recovery and
	// claimed again by a survivor.
	var reclaimed int
	for _, id := range stranded {
		var doc struct {
			Status   events.Status `bson:"status"`
			Attempts int           `bson:"attempts"`
		}
		if err := coll.FindOne(ctx, bson.D{{Key: events.FieldID, Value: id}}).Decode(&doc); err != nil {
			t.Fatalf("find stranded event %v: %v", id, err)
		}
		if doc.Status == events.StatusPublished && doc.Attempts >= 2 {
			reclaimed++
		}
	}
	if reclaimed != len(stranded) {
		t.Errorf("%d of %d stranded events PUBLISHED after a second claim, want all", reclaimed, len(stranded))
	}
	distinct, total, _ := r.Snapshot()
	dups := total - distinct
	t.Logf("all %d events delivered %.1f s after the kill (stale after 15s, recovery every 2s); %d deliveries, %d duplicates",
		n, recovered.Seconds(), total, dups)
	fmt.Printf("E2E-KILL-FIGURES: backend=%s workers=3 events=%d stranded=%d recovered_after_s=%.1f duplicates=%d\n",
		s.name, n, len(stranded), recovered.Seconds(), dups)
	// On MongoDB only the victim's batch can be delivered twice: it may
	// have published some of it before it died.
	if s.atomicClaims && dups > len(stranded) {
		t.Errorf("%d duplicates on MongoDB, want at most the %d events the killed worker held", dups, len(stranded))
	}
}

// checkEveryWorkerPublished checks that each worker marked some events
// PUBLISHED (the mark keeps workerId): a worker stuck at start would
// otherwise go unnoticed behind the others.
func checkEveryWorkerPublished(ctx context.Context, t *testing.T, coll *driver.Collection, procs []*workerproc.Proc) {
	t.Helper()
	counts := make([]int64, len(procs))
	for i, p := range procs {
		counts[i] = publishedBy(ctx, t, coll, p)
		if counts[i] == 0 {
			t.Errorf("%s published no event", p.Name())
		}
	}
	t.Logf("events published per worker: %v", counts)
}

// publishedBy counts the events p marked PUBLISHED (the mark keeps
// workerId).
func publishedBy(ctx context.Context, t *testing.T, coll *driver.Collection, p *workerproc.Proc) int64 {
	t.Helper()
	n, err := coll.CountDocuments(ctx, bson.D{
		{Key: events.FieldStatus, Value: events.StatusPublished},
		{Key: events.FieldWorkerID, Value: p.Name()},
	})
	if err != nil {
		t.Fatalf("count events published by %s: %v", p.Name(), err)
	}
	return n
}

// killHolding kills the worker while it holds claimed events and returns
// their ids: those only recovery can bring back. It waits until the
// worker holds some, freezes it (SIGSTOP), and lets the commands it had
// sent finish on the server, which may still mark or release them; if it
// still holds events then, it kills it (SIGKILL), else lets it go on and
// tries again.
func killHolding(ctx context.Context, t *testing.T, coll *driver.Collection, r *receiver, p *workerproc.Proc, workerID string, n int) []any {
	t.Helper()
	held := bson.D{
		{Key: events.FieldStatus, Value: events.StatusProcessing},
		{Key: events.FieldWorkerID, Value: workerID},
	}
	var ids []any
	testenv.Eventually(t, timeLeft(ctx), func() (bool, string) {
		if got := r.distinct(); got >= n {
			t.Fatalf("all %d events arrived before %s could be killed holding a claim", got, workerID)
		}
		c, err := coll.CountDocuments(ctx, held)
		if err != nil || c == 0 {
			return false, fmt.Sprintf("%s holds no claim (error %v)", workerID, err)
		}
		if err := p.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		if c := settledCount(ctx, t, coll, held); c == 0 {
			if err := p.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			return false, fmt.Sprintf("%s's claims were settled when it froze", workerID)
		}
		ids = findIDs(ctx, t, coll, held)
		if err := p.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		return true, ""
	})
	if _, exited := p.Wait(10 * time.Second); !exited {
		t.Fatalf("%s did not die of SIGKILL", workerID)
	}
	return ids
}

// settledCount counts filter's documents until the count has not changed
// for a second: the commands of a frozen worker still running on the
// server have finished by then. It gives up after settleMax: FerretDB
// rewrites a claim of 500 events one document at a time, and beside the
// starvation scenarios' large heads that took more than 30 s.
func settledCount(ctx context.Context, t *testing.T, coll *driver.Collection, filter bson.D) int64 {
	t.Helper()
	last, stableSince := int64(-1), time.Now()
	testenv.Eventually(t, settleMax, func() (bool, string) {
		c, err := coll.CountDocuments(ctx, filter)
		if err != nil {
			t.Fatalf("count claims: %v", err)
		}
		if c != last {
			last, stableSince = c, time.Now()
		}
		return time.Since(stableSince) >= time.Second, fmt.Sprintf("the count of %v still changes (%d)", filter, last)
	})
	return last
}

// settleMax bounds settledCount's wait: a hang guard.
const settleMax = 3 * time.Minute

// stopTimeout is the SIGTERM scenario's OUTBOX_SHUTDOWN_TIMEOUT: the
// worker's default.
const stopTimeout = 30 * time.Second

// shutdownScenario: SIGTERM a worker in the middle of a backlog of n; it
// exits 0 within its shutdown timeout, leaving nothing PROCESSING and
// nothing confirmed but unmarked.
func shutdownScenario(t *testing.T, s stack, n int) {
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout(n))
	defer cancel()
	db, coll, exchange, r := s.relayed(t)

	insertBacklog(ctx, t, coll, n, "e2e.stopped")
	workerID := db.Name() + "-w0"
	// The stop, not recovery, is under test: the worker's default stale
	// threshold and shutdown timeout, as in production (see relayEnv). On
	// a busy host FerretDB's mark of one batch has taken more than the
	// 10 s of the other scenarios.
	env := s.relayEnv(db.Name(), exchange, workerID)
	env["OUTBOX_SHUTDOWN_TIMEOUT"] = stopTimeout.String()
	p := startWorker(t, workerID, env)
	r.waitDistinct(ctx, t, 1)
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	state, exited := p.Wait(stopTimeout + 5*time.Second)
	took := time.Since(sent)
	if !exited {
		t.Fatalf("worker still running %s after SIGTERM (OUTBOX_SHUTDOWN_TIMEOUT %s)", took.Round(time.Millisecond), stopTimeout)
	}
	if code := state.ExitCode(); code != 0 {
		t.Errorf("worker exited with code %d after SIGTERM, want 0", code)
		checkStopErrorsNamed(t, p.LogSince(0))
	}
	if took > stopTimeout {
		t.Errorf("worker took %s to stop, more than OUTBOX_SHUTDOWN_TIMEOUT %s", took.Round(time.Millisecond), stopTimeout)
	}

	counts := statusCounts(t, coll)
	t.Logf("stopped %s after SIGTERM; documents by status: %v", took.Round(time.Millisecond), counts)
	fmt.Printf("E2E-SIGTERM-FIGURES: backend=%s events=%d stop_seconds=%.2f published=%d new=%d\n",
		s.name, n, took.Seconds(), counts[events.StatusPublished], counts[events.StatusNew])
	if c, err := coll.CountDocuments(ctx, bson.D{
		{Key: events.FieldStatus, Value: events.StatusProcessing},
		{Key: events.FieldWorkerID, Value: workerID},
	}); err != nil || c != 0 {
		t.Errorf("%d documents PROCESSING under %s after it stopped (error %v), want 0", c, workerID, err)
	}
	if got := counts[events.StatusPublished] + counts[events.StatusNew]; got != int64(n) {
		t.Errorf("PUBLISHED + NEW = %d, want all %d events (%v)", got, n, counts)
	}
	if counts[events.StatusNew] == 0 {
		t.Errorf("no event left NEW: the worker finished the backlog before SIGTERM, so the stop was not tested mid-backlog")
	}
	// Nothing the shutdown put back to NEW lost an attempt for it. On a
	// slow database recovery may have reset events before the stop (a
	// claim write that landed after it timed out, whose release timed out
	// too): recovery counts an attempt, by design, and says so in
	// lastError. Those are not the shutdown's.
	recovered := bson.D{{Key: events.FieldLastError, Value: bson.D{{Key: "$regex", Value: "^claim went stale"}}}}
	if c, err := coll.CountDocuments(ctx, recovered); err == nil && c > 0 {
		t.Logf("%d events were reset by recovery before the stop, each an attempt poorer", c)
	}
	if c, err := coll.CountDocuments(ctx, bson.D{
		{Key: events.FieldStatus, Value: events.StatusNew},
		{Key: events.FieldAttempts, Value: bson.D{{Key: "$gt", Value: 0}}},
		{Key: "$nor", Value: bson.A{recovered}},
	}); err != nil || c != 0 {
		t.Errorf("%d NEW documents with an attempt counted, not by recovery (error %v), want 0: a shutdown is not the event's fault", c, err)
	}
	// Every event marked PUBLISHED reached the consumer.
	published := findIDs(ctx, t, coll, bson.D{{Key: events.FieldStatus, Value: events.StatusPublished}})
	want := make([]string, len(published))
	for i, id := range published {
		want[i] = testenv.MessageID(id)
	}
	r.waitIDs(ctx, t, want)
}
