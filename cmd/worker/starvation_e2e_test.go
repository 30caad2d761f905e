package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/internal/workerproc"
)

// The starvation scenarios: four replicas, and at the head of the outbox
// a large backlog that no replica may take (a paused type; aggregates
// held by FAILED events), with healthy events behind it. Every replica
// must publish its share of the healthy events within two claim cycles,
// and none of the events it may not take.
//
// A claim cycle is one run of the worker's claim job that read the
// outbox: a tick of OUTBOX_CLAIM_SCHEDULE, or the run that follows a full
// batch at once, whose read found something to claim or found nothing.
// The worker counts each in outbox_claim_runs_total (result "claimed" or
// "idle"), once the run has published and recorded its batch; the test
// reads it from every replica's /metrics, so that what it asserts is how
// many reads a replica needed, not how long they took on a busy host.
// Runs that failed (a database timeout on a busy host), owned nothing or
// waited for the broker read nothing that could starve, and do not
// count.
const (
	// envPausedHead and envHeldHead set the heads' sizes; the defaults
	// are below the (see pausedHeadDefault).
	envPausedHead = "OUTBOX_E2E_PAUSED_HEAD"
	envHeldHead   = "OUTBOX_E2E_HELD_HEAD"
	// The sizes are 50,000 and 5,000 (OUTBOX_E2E_PAUSED_HEAD=50000
	// OUTBOX_E2E_HELD_HEAD=5000, and the bench's starvation stages). In
	// make test both scenarios run beside each other and the other
	// end-to-end tests on one embedded FerretDB, which sorts the whole
	// head in Go for each of eight replicas' first reads: at the issue's
	// sizes those reads outlast the claim's read timeout on a 2-core host
	// (0 of 400 healthy events in 5 minutes, every read timed out). These
	// sizes are above the head the claim of e2818bd could read past (it
	// published 0 of 400 behind 8,000), and pass in minutes.
	pausedHeadDefault = 10000
	heldHeadDefault   = 1500 // aggregates, each a FAILED event and heldWaitingEach NEW
	heldWaitingEach   = 5

	starveReplicas = 4
	// resumeDrained paused events must be published after the resume.
	resumeDrained = 5000
	// drainLogEvery is how often the paused-head test logs the drain's
	// progress after the resume.
	drainLogEvery = 30 * time.Second
	// starveHealthy healthy events, one to an aggregate, so that every
	// replica owns some of them.
	starveHealthy = 400
	// starveCycles is the claim cycles within which a replica must have
	// published its share, counted from the first cycle that began after
	// the healthy events were written.
	starveCycles = 2
	// starveInsertChunk documents to an InsertMany: the heads are large.
	starveInsertChunk = 2500

	// The scenarios' bounds: the whole of each, and the wait for the
	// replicas' claim cycles after the healthy events were written. Both
	// scenarios run side by side in make test,
	// beside the other end-to-end tests.
	pausedHeadMax = 12 * time.Minute
	heldHeadMax   = 7 * time.Minute
	cyclesWaitMax = 5 * time.Minute

	starvePausedType  = "e2e.paused"
	starveHeldType    = "e2e.held"
	starveHealthyType = "e2e.healthy"
)

// TestE2EStarvationPausedHead runs pausedHeadScenario on embedded
// FerretDB (or the MongoDB in OUTBOX_TEST_MONGO_URI) and the local
// RabbitMQ; TestContainersStarvation on a real MongoDB.
func TestE2EStarvationPausedHead(t *testing.T) {
	t.Parallel()
	pausedHeadScenario(t, localStack(t))
}

// TestE2EStarvationHeldHead runs heldHeadScenario as
// TestE2EStarvationPausedHead runs its scenario.
func TestE2EStarvationHeldHead(t *testing.T) {
	t.Parallel()
	heldHeadScenario(t, localStack(t))
}

// TestContainersStarvation runs both starvation scenarios against a real
// MongoDB (a single-node replica set) and RabbitMQ in containers, as
// container_test.go's suite does; it skips, saying so, without Docker.
func TestContainersStarvation(t *testing.T) {
	t.Parallel()
	mongoURI, amqpURL := testenv.Containers(t)
	s := stack{name: "mongodb", mongoURI: mongoURI, amqpURL: amqpURL, atomicClaims: true}
	runParallel(t, []subtest{
		{"paused-head", func(t *testing.T) { pausedHeadScenario(t, s) }},
		{"held-head", func(t *testing.T) { heldHeadScenario(t, s) }},
	})
}

// pausedHeadScenario: 50,000 NEW events of a paused type at the head,
// healthy events of another type behind them. Every replica publishes its
// share of the healthy events within two claim cycles and none of the
// paused ones; once the type is resumed the paused events flow again (the
// first resumeDrained of them), none lost.
func pausedHeadScenario(t *testing.T, s stack) {
	n := envInt(t, envPausedHead, pausedHeadDefault, 100, 1_000_000)
	ctx, cancel := context.WithTimeout(t.Context(), pausedHeadMax)
	defer cancel()
	db, coll, exchange, r := s.relayed(t)
	paused := insertStarveHead(ctx, t, coll, n, func(i int, base time.Time) bson.D {
		return draftDoc(t, events.Draft{
			Type: starvePausedType, AggregateType: "paused", AggregateID: strconv.Itoa(i % 5000),
			Payload: bson.D{{Key: "n", Value: i}},
		}, base.Add(time.Duration(i)*time.Millisecond))
	})
	tools := map[string]string{"OUTBOX_MONGO_URI": s.mongoURI, "OUTBOX_MONGO_DATABASE": db.Name()}
	runTool(ctx, t, tools, 0, "pause", starvePausedType, "--reason", "starvation test: paused head")

	reps := startReplicas(ctx, t, s, db.Name(), exchange)
	healthy := healthyWithinCycles(ctx, t, coll, reps, r)
	if got := r.arrivedOf(paused); len(got) > 0 {
		t.Errorf("%d events of the paused type were published while it was paused, e.g. %v", len(got), got[:min(5, len(got))])
	}
	if c := countWhere(ctx, t, coll, bson.D{{Key: events.FieldType, Value: starvePausedType}, {Key: events.FieldStatus, Value: events.StatusNew}}); c != int64(n) {
		t.Errorf("%d events of the paused type still NEW, want all %d", c, n)
	}

	// Resumed, the paused events flow again: the test waits for the
	// first resumeDrained of them (the whole drain, 50,000 events on
	// FerretDB, is the bench's paused-head stage, which times it), then
	// checks that nothing was lost and nothing left out of order.
	runTool(ctx, t, tools, 0, "resume", starvePausedType, "--reason", "starvation test: resume")
	resumed := time.Now()
	drained := min(n, resumeDrained)
	pausedPublished := bson.D{{Key: events.FieldType, Value: starvePausedType}, {Key: events.FieldStatus, Value: events.StatusPublished}}
	logged := resumed
	explained(t, coll, func() {
		testenv.Eventually(t, timeLeft(ctx), func() (bool, string) {
			got, err := coll.CountDocuments(ctx, pausedPublished)
			if time.Since(logged) >= drainLogEvery {
				// The drain's pace, to tell a slow start (the unpark) from
				// a slow drain.
				logged = time.Now()
				t.Logf("%d paused events PUBLISHED %s after the resume", got, time.Since(resumed).Round(time.Second))
			}
			return err == nil && got >= int64(drained), fmt.Sprintf("%d of the paused events PUBLISHED after the resume, want %d (error %v)", got, drained, err)
		})
	})
	t.Logf("%d paused events PUBLISHED %s after the resume", drained, time.Since(resumed).Round(time.Second))
	clean := stopReplicas(t, reps)
	r.drain(t)
	published := countWhere(ctx, t, coll, pausedPublished)
	waiting := countWhere(ctx, t, coll, bson.D{{Key: events.FieldType, Value: starvePausedType}, {Key: events.FieldStatus, Value: events.StatusNew}})
	// A replica whose stop ran out of time leaves its batch in flight
	// PROCESSING, for recovery to take back (as the worker says when it
	// exits): those are accounted for too, and only then.
	var held int64
	if !clean {
		held = countWhere(ctx, t, coll, bson.D{{Key: events.FieldType, Value: starvePausedType}, {Key: events.FieldStatus, Value: events.StatusProcessing}})
	}
	if published+waiting+held != int64(n) {
		t.Errorf("%d paused events PUBLISHED, %d NEW and %d PROCESSING (left by a stop that ran out of time) after the replicas stopped, want all %d", published, waiting, held, n)
	}
	if got := r.arrivedOf(paused); int64(len(got)) < published {
		t.Errorf("%d paused events arrived, fewer than the %d PUBLISHED", len(got), published)
	}
	r.checkExactly(t, append(r.arrivedOf(paused), healthy...))
	switch d, total, _ := r.Snapshot(); {
	case total > d && s.atomicClaims:
		t.Errorf("%d deliveries of %d events, want no duplicate: replicas own disjoint partitions", total, d)
	case total > d:
		t.Logf("%d deliveries of %d events: duplicates (a straggling claim write on FerretDB)", total, d)
	}
}

// heldHeadScenario: 5,000 aggregates held by FAILED events at the head,
// 5 NEW events waiting behind each, healthy events behind them. Every
// replica publishes its share of the healthy events within two claim
// cycles, and no held event leaves: the FAILED ones stay FAILED, the
// waiting ones NEW, and none is published.
func heldHeadScenario(t *testing.T, s stack) {
	aggs := envInt(t, envHeldHead, heldHeadDefault, 10, 100_000)
	ctx, cancel := context.WithTimeout(t.Context(), heldHeadMax)
	defer cancel()
	_, coll, exchange, r := s.relayed(t)
	held := insertStarveHead(ctx, t, coll, aggs*(1+heldWaitingEach), func(i int, base time.Time) bson.D {
		agg, pos := i/(1+heldWaitingEach), i%(1+heldWaitingEach)
		d := events.Draft{
			Type: "e2e.step", AggregateType: starveHeldType, AggregateID: strconv.Itoa(agg),
			Payload: bson.D{{Key: "pos", Value: pos}},
		}
		at := base.Add(time.Duration(i) * time.Millisecond)
		if pos > 0 {
			return draftDoc(t, d, at)
		}
		// What a worker leaves after the last attempt: the head of its
		// aggregate, FAILED, holding the events behind it.
		return draftDoc(t, d, at,
			bson.E{Key: events.FieldStatus, Value: events.StatusFailed},
			bson.E{Key: events.FieldAttempts, Value: 5},
			bson.E{Key: events.FieldLastError, Value: "e2e: publish refused"},
			bson.E{Key: events.FieldFailedAt, Value: at})
	})

	reps := startReplicas(ctx, t, s, coll.Database().Name(), exchange)
	healthyWithinCycles(ctx, t, coll, reps, r)
	stopReplicas(t, reps)
	r.drain(t)
	if got := r.arrivedOf(held); len(got) > 0 {
		t.Errorf("%d events of held aggregates were published, want none, e.g. %v", len(got), got[:min(5, len(got))])
	}
	for status, want := range map[events.Status]int{events.StatusFailed: aggs, events.StatusNew: aggs * heldWaitingEach} {
		if c := countWhere(ctx, t, coll, bson.D{{Key: events.FieldAggregateType, Value: starveHeldType}, {Key: events.FieldStatus, Value: status}}); c != int64(want) {
			t.Errorf("%d events of held aggregates %s, want %d as inserted", c, status, want)
		}
	}
}

// insertStarveHead inserts n documents made by mk, starveInsertChunk to
// an InsertMany, and returns their message ids. mk gets the time an hour
// ago, before which no document is created.
func insertStarveHead(ctx context.Context, t *testing.T, coll *driver.Collection, n int, mk func(i int, base time.Time) bson.D) []string {
	t.Helper()
	start := time.Now()
	base := start.UTC().Add(-time.Hour).Truncate(time.Millisecond)
	ids := make([]string, 0, n)
	for done := 0; done < n; {
		docs := make([]any, 0, min(starveInsertChunk, n-done))
		for range cap(docs) {
			d := mk(done, base)
			ids = append(ids, testenv.MessageID(d[0].Value))
			docs = append(docs, d)
			done++
		}
		if _, err := coll.InsertMany(ctx, docs); err != nil {
			t.Fatalf("insert the head, documents %d..%d: %v", done-len(docs), done-1, err)
		}
	}
	t.Logf("inserted a head of %d documents in %s", n, time.Since(start).Round(time.Millisecond))
	return ids
}

// starveReplica is a worker process of a starvation scenario and the
// address of its HTTP server.
type starveReplica struct {
	*workerproc.Proc
	addr string
}

// startReplicas starts starveReplicas workers at the relay scenarios'
// settings (ordering on, the default), but claims and recovery at their
// default schedules: each claim over the large head is a read of all of
// it on FerretDB, and the test counts cycles, not seconds. It waits
// until they share every partition, each owning some.
func startReplicas(ctx context.Context, t *testing.T, s stack, db, exchange string) []starveReplica {
	t.Helper()
	reps := make([]starveReplica, starveReplicas)
	for i := range reps {
		addr, err := workerproc.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("%s-w%d", db, i)
		env := s.relayEnv(db, exchange, id)
		env["OUTBOX_HTTP_ADDR"] = addr
		env["OUTBOX_CLAIM_SCHEDULE"] = "@every 1s"
		delete(env, "OUTBOX_RECOVERY_SCHEDULE")
		reps[i] = starveReplica{startWorker(t, id, env), addr}
	}
	testenv.Eventually(t, timeLeft(ctx), func() (bool, string) {
		owned, total := make([]int, len(reps)), 0
		for i, rep := range reps {
			owned[i] = rep.partitions(ctx)
			total += owned[i]
		}
		return total == events.Partitions && !containsZero(owned),
			fmt.Sprintf("partitions owned by the replicas: %v, want all %d shared by all", owned, events.Partitions)
	})
	return reps
}

func containsZero(xs []int) bool {
	for _, x := range xs {
		if x == 0 {
			return true
		}
	}
	return false
}

// stopReplicas stops every replica with SIGTERM, side by side, and waits
// for each to exit. How they stop is not what these scenarios test (the
// SIGTERM scenario does): on a busy host a replica's last write over the
// large head can outlast its shutdown timeout, and it then exits 1 by
// design, leaving its batch PROCESSING for recovery; that is logged, not
// failed, and stopReplicas reports whether every replica stopped cleanly.
func stopReplicas(t *testing.T, reps []starveReplica) (clean bool) {
	t.Helper()
	clean = true
	for _, rep := range reps {
		if err := rep.Signal(syscall.SIGTERM); err != nil {
			t.Error(err)
		}
	}
	for _, rep := range reps {
		state, exited := rep.Wait(shutdownTimeout + 5*time.Second)
		switch {
		case !exited:
			clean = false
			t.Errorf("%s still running %s after SIGTERM", rep.Name(), shutdownTimeout+5*time.Second)
		case state.ExitCode() != 0:
			clean = false
			t.Logf("%s exited with code %d after SIGTERM (its stop ran out of time); its last lines:\n%s", rep.Name(), state.ExitCode(), rep.Tail(5))
		}
	}
	return clean
}

// partitions is how many partitions the replica owns, from /status; 0
// while it cannot tell.
func (rep starveReplica) partitions(ctx context.Context) int {
	_, body, err := httpGet(ctx, "http://"+rep.addr+"/status")
	if err != nil {
		return 0
	}
	var st struct {
		Ownership struct {
			Partitions int `json:"partitions"`
		} `json:"ownership"`
	}
	_ = json.Unmarshal(body, &st) // 0 when not (yet) readable
	return st.Ownership.Partitions
}

// claimRunLine is a sample of outbox_claim_runs_total, its labels and
// its value; readRun is a label set of a run that read the outbox (a
// claim cycle). The labels are matched apart from the sample, for the
// worker labels every series with its outbox too (outbox="default" in a
// worker of one outbox), in an order the test should not depend on.
var (
	claimRunLine = regexp.MustCompile(`^outbox_claim_runs_total\{([^}]*)\} ([0-9.e+]+)$`)
	readRun      = regexp.MustCompile(`(?:^|,)result="(?:claimed|idle)"(?:,|$)`)
)

// claimCycles is how many claim cycles the replica has finished, from its
// /metrics.
func (rep starveReplica) claimCycles(ctx context.Context) (int, error) {
	code, body, err := httpGet(ctx, "http://"+rep.addr+"/metrics")
	if err == nil && code != 200 {
		err = fmt.Errorf("GET /metrics: HTTP %d", code)
	}
	if err != nil {
		return 0, fmt.Errorf("%s: %w", rep.Name(), err)
	}
	return claimCyclesIn(body)
}

// claimCyclesIn sums the claim cycles in a /metrics body.
func claimCyclesIn(body []byte) (int, error) {
	var runs float64
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		if m := claimRunLine.FindStringSubmatch(sc.Text()); m != nil && readRun.MatchString(m[1]) {
			v, err := strconv.ParseFloat(m[2], 64)
			if err != nil {
				return 0, fmt.Errorf("outbox_claim_runs_total sample %q: %w", sc.Text(), err)
			}
			runs += v
		}
	}
	return int(runs), sc.Err()
}

// healthyWithinCycles writes starveHealthy healthy events behind the
// head, with the replicas running, and checks that each replica has
// published its share of them by the end of its starveCycles-th claim
// cycle that began after they were written: the cycle in flight when
// they were written may have read the outbox before them, so a replica's
// checkpoint is starveCycles+1 finished cycles after the count read just
// after the insert. Its share is what it published in the end; it must
// have published all of it, and some, by its checkpoint. The wait for
// the checkpoints is bounded (cyclesWaitMax): a replica whose claims kept
// failing meanwhile has had fewer cycles, and what it published by then
// stands for its checkpoint; every healthy event must be out by then. It
// returns the healthy events' message ids, all received.
func healthyWithinCycles(ctx context.Context, t *testing.T, coll *driver.Collection, reps []starveReplica, r *receiver) []string {
	t.Helper()
	ids := make([]string, 0, starveHealthy)
	docs := make([]any, 0, starveHealthy)
	now := time.Now()
	for i := range starveHealthy {
		d := draftDoc(t, events.Draft{
			Type: starveHealthyType, AggregateType: "healthy", AggregateID: strconv.Itoa(i),
			Payload: bson.D{{Key: "n", Value: i}},
		}, now)
		ids, docs = append(ids, testenv.MessageID(d[0].Value)), append(docs, d)
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatalf("insert the healthy events: %v", err)
	}
	written := time.Now()
	start := make([]int, len(reps))
	for i, rep := range reps {
		c, err := rep.claimCycles(ctx)
		if err != nil {
			t.Fatal(err)
		}
		start[i] = c
	}
	// Each replica's healthy events PUBLISHED by it at its checkpoint,
	// read as soon as the test sees the checkpoint (a later read only
	// gives it more time).
	atCheckpoint := make([]int64, len(reps))
	reached := make([]bool, len(reps))
	var waiting []string
	for deadline := time.Now().Add(min(timeLeft(ctx), cyclesWaitMax)); ; time.Sleep(100 * time.Millisecond) {
		waiting = waiting[:0]
		for i, rep := range reps {
			if reached[i] {
				continue
			}
			c, err := rep.claimCycles(ctx)
			if err == nil && c >= start[i]+starveCycles+1 {
				atCheckpoint[i], reached[i] = healthyPublishedBy(ctx, t, coll, rep.Name()), true
				continue
			}
			waiting = append(waiting, fmt.Sprintf("%s at %d of %d claim cycles (%v)", rep.Name(), c-start[i], starveCycles+1, err))
		}
		if len(waiting) == 0 || time.Now().After(deadline) {
			break
		}
	}
	// A replica still short of its checkpoint (its claims failed on a
	// busy host) has had fewer cycles: what it published so far counts.
	var done []string
	for i, rep := range reps {
		if !reached[i] {
			atCheckpoint[i] = healthyPublishedBy(ctx, t, coll, rep.Name())
			continue
		}
		done = append(done, fmt.Sprintf("%s %d", rep.Name(), atCheckpoint[i]))
	}
	total := countWhere(ctx, t, coll, bson.D{{Key: events.FieldType, Value: starveHealthyType}, {Key: events.FieldStatus, Value: events.StatusPublished}})
	summary := fmt.Sprintf("%d of %d healthy events PUBLISHED %s after they were written; healthy events each replica had published at the end of its %d claim cycles: %s; short of them: %s",
		total, starveHealthy, time.Since(written).Round(time.Millisecond), starveCycles+1, strings.Join(done, ", "), strings.Join(waiting, ", "))
	t.Log(summary)
	if total != starveHealthy {
		// Starved: the rest of the scenario would wait on it.
		t.Fatalf("%d of %d healthy events PUBLISHED, want all within %d claim cycles on every replica (above); documents by status: %s",
			total, starveHealthy, starveCycles, statusSummary(ctx, coll))
	}
	for i, rep := range reps {
		share := healthyPublishedBy(ctx, t, coll, rep.Name())
		switch {
		case share == 0:
			t.Errorf("%s published none of the healthy events, want its share", rep.Name())
		case share != atCheckpoint[i]:
			t.Errorf("%s had published %d of its %d healthy events by its checkpoint, want all within %d claim cycles", rep.Name(), atCheckpoint[i], share, starveCycles)
		}
	}
	r.waitIDs(ctx, t, ids)
	return ids
}

// healthyPublishedBy counts the healthy events the worker called id
// marked PUBLISHED.
func healthyPublishedBy(ctx context.Context, t *testing.T, coll *driver.Collection, id string) int64 {
	t.Helper()
	return countWhere(ctx, t, coll, bson.D{
		{Key: events.FieldType, Value: starveHealthyType},
		{Key: events.FieldStatus, Value: events.StatusPublished},
		{Key: events.FieldWorkerID, Value: id},
	})
}

// statusSummary counts coll's documents by status for a failure
// message; a count that fails on a busy host says so in its place.
func statusSummary(ctx context.Context, coll *driver.Collection) string {
	var parts []string
	for _, st := range events.Statuses {
		n, err := coll.CountDocuments(ctx, bson.D{{Key: events.FieldStatus, Value: st}})
		if err != nil {
			parts = append(parts, fmt.Sprintf("%s: count failed (%v)", st, err))
			continue
		}
		parts = append(parts, fmt.Sprintf("%s: %d", st, n))
	}
	return strings.Join(parts, ", ")
}

func countWhere(ctx context.Context, t *testing.T, coll *driver.Collection, filter bson.D) int64 {
	t.Helper()
	n, err := coll.CountDocuments(ctx, filter)
	if err != nil {
		t.Fatalf("count %v: %v", filter, err)
	}
	return n
}
