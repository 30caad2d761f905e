package main

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/internal/workerproc"
	"github.com/outboxrelay/outbox/mongo"
)

// Settings of the paused-worker scenario: a short stale threshold, so that
// the frozen worker's claim is recovered within seconds.
const (
	pauseStaleAfter     = 10 * time.Second
	pausePublishTimeout = 2 * time.Second
	pauseAggregates     = 60
	pausePerAggregate   = 40
)

// TestE2EPausedWorkerPublishesNothingStale: a worker frozen (SIGSTOP)
// right after its claim, for longer than the stale threshold, while
// another worker recovers its events and relays them and their
// successors, publishes nothing of that batch when it is continued
// (SIGCONT): its publish deadline, on the monotonic clock, passed while it
// was frozen. Every event is delivered exactly once, each aggregate in
// order. Before, it published its whole stale batch on resuming:
// duplicates, late, behind later events of the same aggregates.
func TestE2EPausedWorkerPublishesNothingStale(t *testing.T) {
	t.Parallel()
	s := localStack(t)
	n := pauseAggregates * pausePerAggregate
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout(n)+time.Minute)
	defer cancel()
	db := s.database(t)
	coll := db.Collection(mongo.CollectionDefault)
	exchange := testenv.UniqueName(t, "ex_")
	r := consumeOrdered(t, s, exchange, typeStep)

	// Round j holds the j-th event of every aggregate: a batch spans many
	// aggregates, each of them several events deep.
	start := time.Now().UTC().Add(-time.Minute).Truncate(time.Millisecond)
	planned := make([]plannedEvent, 0, n)
	for j := range pausePerAggregate {
		for a := range pauseAggregates {
			planned = append(planned, plannedEvent{
				id: fmt.Sprintf("p-%03d-%03d", a, j), aggregate: aggregateOf(a), pos: j,
				createdAt: start.Add(time.Duration(len(planned)) * time.Millisecond), typ: typeStep,
			})
		}
	}
	insertPlanned(ctx, t, coll, planned)
	ids := make([]string, len(planned))
	for i, e := range planned {
		ids[i] = e.id
	}

	startNth := func(i int) *workerproc.Proc {
		id := fmt.Sprintf("%s-w%d", db.Name(), i)
		env := s.workerEnv(db.Name(), exchange, id)
		for k, v := range map[string]string{
			"OUTBOX_BATCH_SIZE":        "500",
			"OUTBOX_CLAIM_SCHEDULE":    "@every 100ms",
			"OUTBOX_RECOVERY_SCHEDULE": "@every 1s",
			"OUTBOX_STALE_AFTER":       pauseStaleAfter.String(),
			"OUTBOX_PUBLISH_TIMEOUT":   pausePublishTimeout.String(),
		} {
			env[k] = v
		}
		return startWorker(t, id, env)
	}
	// 1. Freeze the worker as soon as its claim shows, before it has
	// published any of it. It runs alone until then: started beside it,
	// the other worker could take every partition first and, on a quiet
	// host, relay the whole outbox before this one claimed anything.
	frozen := startNth(0)
	defer func() { _ = frozen.Signal(syscall.SIGCONT) }() // never left frozen
	stale := freezeAfterClaim(ctx, t, coll, r, frozen, n)
	t.Logf("froze %s holding %d events; %d of %d events received", frozen.Name(), len(stale), r.distinct(), n)
	other := startNth(1)

	// 2. The other worker takes the partitions over, recovery resets the
	// frozen claim after the stale threshold, and the other worker relays
	// those events and the next event of each of their aggregates. The
	// frozen worker stays frozen no longer than that: well under the 30 s
	// after which its AMQP client gives up on the silent connection, so
	// that, resumed, it could still publish.
	byID := make(map[string]plannedEvent, n)
	for _, e := range planned {
		byID[e.id] = e
	}
	var relayed []string
	for _, id := range stale {
		e := byID[testenv.MessageID(id)]
		relayed = append(relayed, e.id)
		if e.pos+1 < pausePerAggregate {
			relayed = append(relayed, fmt.Sprintf("p-%s-%03d", strings.TrimPrefix(e.aggregate, "agg-"), e.pos+1))
		}
	}
	frozenAt := time.Now()
	explained(t, coll, func() { r.waitIDs(ctx, t, relayed) })
	t.Logf("%s frozen for %s before resuming", frozen.Name(), time.Since(frozenAt).Round(time.Second))

	// 3. The frozen worker resumes: its batch's publish deadline passed
	// while it was frozen, so it publishes none of it. (If its claim's
	// write reply is read after the write's own deadline fired, the
	// claim fails instead, and nothing is published either.)
	mark := frozen.LogSize()
	if err := frozen.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	why := resumedOutcome(frozen, mark, 30*time.Second)
	if why != "" {
		t.Log(why)
	} else {
		t.Errorf("the resumed worker never said what became of its batch; its log since it resumed:\n%s", frozen.LogSince(mark))
	}
	explained(t, coll, func() { r.waitIDs(ctx, t, ids) })
	waitCount(ctx, t, coll, bson.D{{Key: events.FieldStatus, Value: events.StatusPublished}}, int64(n))
	stopWorkers(t, frozen, other)
	r.drain(t)

	r.checkExactly(t, ids)
	// The frozen batch is delivered once: by the worker that recovered
	// it, never again by the resumed one. Elsewhere a duplicate can have
	// another cause on FerretDB, whose guarded updates are not atomic: a
	// claim write that timed out on a busy host and landed after the
	// partition's next owner claimed the same events (the database's
	// fence refuses it where there are transactions; the container suite
	// checks for none there). Those are logged, not failed.
	dups := r.duplicates()
	staleDups := map[string]int{}
	for _, id := range stale {
		if c := dups[testenv.MessageID(id)]; c > 0 {
			staleDups[testenv.MessageID(id)] = c
		}
	}
	// On a busy host the worker that recovered the frozen batch may fail
	// to mark it PUBLISHED within the stale threshold (each of FerretDB's
	// updates reads the whole collection); recovery then resets what it
	// published, and it is published again: at-least-once, explained by
	// that worker's log, while the frozen worker says it published none.
	recovererMarkFailed := strings.Contains(other.LogSince(0), `"error":"mark `)
	switch {
	case len(staleDups) > 0 && why != "" && recovererMarkFailed:
		t.Logf("%d events of the frozen batch delivered more than once after the worker that recovered them failed to mark them PUBLISHED in time (its log says so), while the frozen worker published none of it: redeliveries, not the stale batch: %v",
			len(staleDups), firstOf(staleDups, 10))
	case len(staleDups) > 0 && why == claimFailed:
		// The frozen worker's claim never returned a batch, so it had
		// none to publish: these copies are FerretDB's, as below.
		t.Logf("%d events of the frozen batch delivered more than once, though the frozen worker published none of it (its claim write failed): a straggling claim write on FerretDB: %v",
			len(staleDups), firstOf(staleDups, 10))
	case len(staleDups) > 0:
		t.Errorf("%d events of the frozen batch delivered more than once, want none (the frozen worker published its stale batch?): %v", len(staleDups), firstOf(staleDups, 10))
	}
	if len(dups) > len(staleDups) {
		t.Logf("%d other events delivered more than once (a straggling claim write on FerretDB): %v", len(dups)-len(staleDups), firstOf(dups, 10))
	}
	if v := orderViolations(planned, r.firstArrivals()); len(v) > 0 {
		t.Errorf("%d events first arrived before an earlier event of their aggregate:\n%s", len(v), strings.Join(v[:min(10, len(v))], "\n"))
	}
	var byOther int64
	if c, err := coll.CountDocuments(ctx, bson.D{
		{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: stale}}},
		{Key: events.FieldStatus, Value: events.StatusPublished},
		{Key: events.FieldWorkerID, Value: other.Name()},
	}); err != nil {
		t.Fatalf("count the stale batch's events: %v", err)
	} else {
		byOther = c
	}
	switch {
	case byOther != int64(len(stale)) && recovererMarkFailed:
		t.Logf("%d of the frozen worker's %d claimed events were marked PUBLISHED by the worker that recovered them; its mark failed, and the rest were claimed again", byOther, len(stale))
	case byOther != int64(len(stale)):
		t.Errorf("%d of the frozen worker's %d claimed events were marked PUBLISHED by the worker that recovered them, want all", byOther, len(stale))
	}
}

// freezeAfterClaim stops p (SIGSTOP) as soon as events PROCESSING under
// its id appear, which is while its claim's write is still under way on
// FerretDB (it rewrites the batch one document at a time), and returns the
// ids it holds once the server has finished that write. If any of them
// arrived or arrives within inFlightGrace (on a busy host the write may
// be over, and the publish begun, before the test sees the claim), it
// continues p and tries again with a later batch: the scenario needs a
// claim none of whose events left.
func freezeAfterClaim(ctx context.Context, t *testing.T, coll *driver.Collection, r *orderReceiver, p *workerproc.Proc, n int) []any {
	t.Helper()
	held := bson.D{
		{Key: events.FieldStatus, Value: events.StatusProcessing},
		{Key: events.FieldWorkerID, Value: p.Name()},
	}
	for attempt := 1; ; attempt++ {
		for {
			if ctx.Err() != nil {
				t.Fatalf("%s never claimed: %v", p.Name(), ctx.Err())
			}
			if got := r.distinct(); got >= n {
				t.Fatalf("all %d events arrived before %s could be frozen after a claim (%d attempts)", got, p.Name(), attempt)
			}
			if c, err := coll.CountDocuments(ctx, held); err == nil && c > 0 {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
		if err := p.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		var ids []any
		if settledCount(ctx, t, coll, held) > 0 {
			ids = findIDs(ctx, t, coll, held)
			sent := arrivingOf(r, ids, inFlightGrace)
			if sent == 0 {
				return ids
			}
			t.Logf("attempt %d: %s had published %d of its %d claimed events when it froze; trying again", attempt, p.Name(), sent, len(ids))
		}
		if err := p.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		// Past this claim: wait until it is settled.
		testenv.Eventually(t, timeLeft(ctx), func() (bool, string) {
			c, err := coll.CountDocuments(ctx, held)
			return err == nil && c == 0, fmt.Sprintf("%s still holds %d events", p.Name(), c)
		})
	}
}

// inFlightGrace is how long messages a worker sent just before it froze
// may take to reach the test's consumer on a busy host.
const inFlightGrace = 3 * time.Second

// arrivingOf returns how many of ids have arrived at r, or arrive within
// grace: a frozen worker may have sent some just before it froze.
func arrivingOf(r *orderReceiver, ids []any, grace time.Duration) int {
	for end := time.Now().Add(grace); ; time.Sleep(50 * time.Millisecond) {
		counts, sent := r.Counts(), 0
		for _, id := range ids {
			if counts[testenv.MessageID(id)] > 0 {
				sent++
			}
		}
		if sent > 0 || time.Now().After(end) {
			return sent
		}
	}
}

// claimFailed is resumedOutcome's answer when the frozen worker's claim
// failed: it returned no batch, so none was published.
const claimFailed = "the resumed worker's claim write had failed: nothing of its batch was published"

// resumedOutcome waits up to timeout for p's log to say what became of
// the batch it claimed before it froze, and returns which it was ("" if
// it never said).
func resumedOutcome(p *workerproc.Proc, mark int64, timeout time.Duration) string {
	for end := time.Now().Add(timeout); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		logged := p.LogSince(mark)
		switch {
		case strings.Contains(logged, "publish deadline passed"):
			return "the resumed worker's publish deadline had passed: nothing of its batch was published"
		case strings.Contains(logged, "claim batch: "):
			return claimFailed
		case strings.Contains(logged, "fence refused"):
			return "the resumed worker's claim was refused by the database's fence: nothing of it was published"
		}
	}
	return ""
}

// firstOf returns up to n entries of m, for a message.
func firstOf(m map[string]int, n int) []string {
	var out []string
	for id, c := range m {
		if len(out) == n {
			break
		}
		out = append(out, fmt.Sprintf("%s x%d", id, c))
	}
	return out
}
