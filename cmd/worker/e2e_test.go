package main

// End-to-end tests: the built worker binary, run as several processes,
// against a MongoDB wire-protocol server and RabbitMQ. The scenarios take a
// stack, so that the same functions run here against embedded FerretDB and
// the local RabbitMQ, and in container_test.go against real MongoDB (a
// replica set) and RabbitMQ in containers.
//
// OUTBOX_E2E_EVENTS sets the backlog of the relay, kill and SIGTERM
// scenarios (default 3,000; 1,000 under -race), OUTBOX_E2E_WORKERS the worker processes of the relay
// scenario (default 3). The relay scenario prints a line starting with
// E2E-FIGURES: (run with -v to see it), e.g.
//
//	OUTBOX_E2E_EVENTS=10000 OUTBOX_E2E_WORKERS=1 go test -count=1 -v -timeout 30m -run 'TestE2E/relay' ./cmd/worker/

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
)

// Environment variables of the end-to-end tests.
const (
	envE2EEvents  = "OUTBOX_E2E_EVENTS"
	envE2EWorkers = "OUTBOX_E2E_WORKERS"

	e2eEventsDefault  = 3000
	e2eEventsRace     = 1000 // default under -race; see e2eEvents
	e2eWorkersDefault = 3
	// mongoMidBacklog is the least backlog of the kill and SIGTERM
	// scenarios on MongoDB; see runScenarios.
	mongoMidBacklog = 30000

	// insertChunk is how many events one InsertMany writes.
	insertChunk = 500
	// shutdownTimeout is the workers' OUTBOX_SHUTDOWN_TIMEOUT.
	shutdownTimeout = 10 * time.Second
	// pollEvery is how often the tests look at a condition they wait for.
	pollEvery = 100 * time.Millisecond
)

// TestE2E runs every end-to-end scenario against embedded FerretDB (or the
// MongoDB in OUTBOX_TEST_MONGO_URI) and the local RabbitMQ.
func TestE2E(t *testing.T) {
	t.Parallel()
	s := stack{
		name:         "ferretdb",
		mongoURI:     testenv.MongoURI(t),
		amqpURL:      testenv.AMQPURL(t),
		atomicClaims: !testenv.IsFerretDB(),
	}
	if s.atomicClaims {
		s.name = "mongodb"
	}
	runScenarios(t, s, e2eWorkers(t))
}

// runScenarios runs every scenario against s, in parallel, the relay
// scenario with the given number of worker processes.
func runScenarios(t *testing.T, s stack, workers int) {
	n := e2eEvents(t)
	// The kill and SIGTERM scenarios must catch a worker in the middle of
	// the backlog. MongoDB relays a few thousand events in well under a
	// second, before the test could; give it a backlog that lasts.
	mid := n
	if s.atomicClaims {
		mid = max(n, mongoMidBacklog)
	}
	t.Run("relay", func(t *testing.T) {
		t.Parallel()
		relayScenario(t, s, workers, n)
	})
	t.Run("kill", func(t *testing.T) {
		t.Parallel()
		killScenario(t, s, mid)
	})
	t.Run("sigterm", func(t *testing.T) {
		t.Parallel()
		shutdownScenario(t, s, mid)
	})
	t.Run("tools", func(t *testing.T) {
		t.Parallel()
		toolsScenario(t, s)
	})
	t.Run("claims", func(t *testing.T) {
		t.Parallel()
		claimsScenario(t, s, 4, 1000)
	})
	t.Run("friendly", func(t *testing.T) {
		t.Parallel()
		friendlyScenario(t, s, 300)
	})
}

// stack is where a scenario runs: a MongoDB wire-protocol server and a
// RabbitMQ broker, both reachable from worker processes.
type stack struct {
	name     string
	mongoURI string
	amqpURL  string
	// atomicClaims is true on a real MongoDB, where a claim is atomic per
	// document and several workers must never deliver an event twice.
	// FerretDB rewrites matched documents one by one, so two workers can
	// both win the same event there: duplicates are counted, not failed.
	atomicClaims bool
}

// connect returns a client of s's MongoDB with a modest pool, disconnected
// in t.Cleanup. more, if given, adds options.
func (s stack) connect(t *testing.T, poolSize uint64, more ...func(*options.ClientOptions)) *driver.Client {
	t.Helper()
	opts := options.Client().ApplyURI(s.mongoURI).SetMaxPoolSize(poolSize)
	for _, f := range more {
		f(opts)
	}
	client, err := driver.Connect(opts)
	if err != nil {
		t.Fatalf("connect to MongoDB: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 30*time.Second)
		defer cancel()
		_ = client.Disconnect(ctx)
	})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := client.Ping(ctx, nil); err != nil {
		t.Fatalf("ping MongoDB: %v", err)
	}
	return client
}

// database returns a database of its own for this test, dropped in
// t.Cleanup.
func (s stack) database(t *testing.T) *driver.Database {
	t.Helper()
	return uniqueDatabase(t, s.connect(t, testenv.ClientMaxPoolSize))
}

// uniqueDatabase returns a database of client named for this test,
// dropped in t.Cleanup.
func uniqueDatabase(t *testing.T, client *driver.Client) *driver.Database {
	t.Helper()
	db := client.Database(testenv.UniqueName(t, "e2e_"))
	t.Cleanup(func() { // runs before the client's disconnect
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 30*time.Second)
		defer cancel()
		if err := db.Drop(ctx); err != nil {
			t.Logf("drop database %s: %v", db.Name(), err)
		}
	})
	return db
}

// workerEnv is the environment of a worker relaying db to exchange.
func (s stack) workerEnv(db, exchange, workerID string) map[string]string {
	batch := "500" // the default, stated so that the figures say what they measured
	if raceEnabled() {
		// Under -race, FerretDB's UpdateMany of 500 documents can outlast
		// the worker's 5 s budget for recording a batch's outcome.
		batch = "100"
	}
	return map[string]string{
		"OUTBOX_BATCH_SIZE":        batch,
		"OUTBOX_MONGO_URI":         s.mongoURI,
		"OUTBOX_MONGO_DATABASE":    db,
		"OUTBOX_AMQP_URL":          s.amqpURL,
		"OUTBOX_AMQP_EXCHANGE":     exchange,
		"OUTBOX_CLAIM_SCHEDULE":    "@every 200ms",
		"OUTBOX_RECOVERY_SCHEDULE": "@every 2s",
		"OUTBOX_STALE_AFTER":       "15s",
		"OUTBOX_PUBLISH_TIMEOUT":   "4s",
		"OUTBOX_SHUTDOWN_TIMEOUT":  shutdownTimeout.String(),
		"OUTBOX_HTTP_ADDR":         "127.0.0.1:0",
		"OUTBOX_LOG_LEVEL":         "warn",
		"OUTBOX_WORKER_ID":         workerID,
	}
}

// ---------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------

// relayScenario: workers relay a backlog of n events; every event arrives
// and every document ends PUBLISHED.
func relayScenario(t *testing.T, s stack, workers, n int) {
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout(n))
	defer cancel()
	db := s.database(t)
	coll := db.Collection(mongo.CollectionDefault)
	exchange := testenv.UniqueName(t, "ex_")
	r := consume(t, s, exchange)

	firstInsert := time.Now()
	ids := insertBacklog(ctx, t, coll, n, "e2e.relayed")
	inserted := time.Now()
	procs := make([]*workerProc, workers)
	for i := range procs {
		id := fmt.Sprintf("%s-w%d", db.Name(), i)
		procs[i] = startWorker(t, id, s.workerEnv(db.Name(), exchange, id))
	}

	if err := r.waitDistinct(ctx, n); err != nil {
		t.Fatalf("%v; documents by status: %v", err, statusCounts(t, coll))
	}
	_, _, last := r.snapshot()
	waitCount(ctx, t, coll, bson.D{{Key: events.FieldStatus, Value: events.StatusPublished}}, int64(n))
	stopWorkers(t, procs...)
	r.drain(t)

	r.checkExactly(t, ids)
	checkEveryWorkerPublished(ctx, t, coll, procs)
	distinct, total, _ := r.snapshot()
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
	db := s.database(t)
	coll := db.Collection(mongo.CollectionDefault)
	exchange := testenv.UniqueName(t, "ex_")
	r := consume(t, s, exchange)

	ids := insertBacklog(ctx, t, coll, n, "e2e.killed")
	procs := make([]*workerProc, 3)
	workerIDs := make([]string, len(procs))
	for i := range procs {
		workerIDs[i] = fmt.Sprintf("%s-w%d", db.Name(), i)
		procs[i] = startWorker(t, workerIDs[i], s.workerEnv(db.Name(), exchange, workerIDs[i]))
	}
	victim, victimID := procs[0], workerIDs[0]

	if err := r.waitDistinct(ctx, n/5); err != nil {
		t.Fatalf("before the kill: %v", err)
	}
	stranded := killHolding(ctx, t, coll, r, victim, victimID, n)
	killedAt := time.Now()
	t.Logf("killed %s holding %d events; %d of %d events received", victimID, len(stranded), r.distinct(), n)

	if err := r.waitDistinct(ctx, n); err != nil {
		t.Fatalf("after the kill: %v; documents by status: %v", err, statusCounts(t, coll))
	}
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
	distinct, total, _ := r.snapshot()
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
func checkEveryWorkerPublished(ctx context.Context, t *testing.T, coll *driver.Collection, procs []*workerProc) {
	t.Helper()
	counts := make([]int64, len(procs))
	for i, p := range procs {
		n, err := coll.CountDocuments(ctx, bson.D{
			{Key: events.FieldStatus, Value: events.StatusPublished},
			{Key: events.FieldWorkerID, Value: p.name},
		})
		if err != nil {
			t.Fatalf("count events published by %s: %v", p.name, err)
		}
		counts[i] = n
		if n == 0 {
			t.Errorf("%s published no event", p.name)
		}
	}
	t.Logf("events published per worker: %v", counts)
}

// killHolding kills the worker while it holds claimed events and returns
// their ids: those only recovery can bring back. It waits until the
// worker holds some, freezes it (SIGSTOP), and lets the commands it had
// sent finish on the server, which may still mark or release them; if it
// still holds events then, it kills it (SIGKILL), else lets it go on and
// tries again.
func killHolding(ctx context.Context, t *testing.T, coll *driver.Collection, r *receiver, p *workerProc, workerID string, n int) []any {
	t.Helper()
	held := bson.D{
		{Key: events.FieldStatus, Value: events.StatusProcessing},
		{Key: events.FieldWorkerID, Value: workerID},
	}
	var ids []any
	err := poll(ctx, 20*time.Millisecond, func() (bool, error) {
		if got := r.distinct(); got >= n {
			return false, fmt.Errorf("all %d events arrived before %s could be killed holding a claim", got, workerID)
		}
		c, err := coll.CountDocuments(ctx, held)
		if err != nil || c == 0 {
			return false, err
		}
		if err := p.signal(syscall.SIGSTOP); err != nil {
			return false, err
		}
		if c, err = settledCount(ctx, coll, held); err != nil || c == 0 {
			return false, errors.Join(err, p.signal(syscall.SIGCONT))
		}
		ids = findIDs(ctx, t, coll, held)
		return true, p.signal(syscall.SIGKILL)
	})
	if err != nil {
		t.Fatalf("kill %s while it holds a claim: %v", workerID, err)
	}
	if _, exited := p.wait(10 * time.Second); !exited {
		t.Fatalf("%s did not die of SIGKILL", workerID)
	}
	return ids
}

// settledCount counts filter's documents until the count has not changed
// for a second (giving up after 30 s: under -race one count on the embedded
// FerretDB can take seconds): the commands of a frozen worker still running
// on the server have finished by then.
func settledCount(ctx context.Context, coll *driver.Collection, filter bson.D) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	last, err := coll.CountDocuments(ctx, filter)
	if err != nil {
		return 0, err
	}
	stableSince := time.Now()
	err = poll(ctx, 250*time.Millisecond, func() (bool, error) {
		c, err := coll.CountDocuments(ctx, filter)
		if err != nil {
			return false, err
		}
		if c != last {
			last, stableSince = c, time.Now()
		}
		return time.Since(stableSince) >= time.Second, nil
	})
	return last, err
}

// shutdownScenario: SIGTERM a worker in the middle of a backlog of n; it
// exits 0 within its shutdown timeout, leaving nothing PROCESSING and
// nothing confirmed but unmarked.
func shutdownScenario(t *testing.T, s stack, n int) {
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout(n))
	defer cancel()
	db := s.database(t)
	coll := db.Collection(mongo.CollectionDefault)
	exchange := testenv.UniqueName(t, "ex_")
	r := consume(t, s, exchange)

	insertBacklog(ctx, t, coll, n, "e2e.stopped")
	workerID := db.Name() + "-w0"
	p := startWorker(t, workerID, s.workerEnv(db.Name(), exchange, workerID))
	if err := r.waitDistinct(ctx, 1); err != nil {
		t.Fatalf("before SIGTERM: %v", err)
	}
	if err := p.signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	code, exited := p.wait(shutdownTimeout + 5*time.Second)
	took := time.Since(sent)
	if !exited {
		t.Fatalf("worker still running %s after SIGTERM (OUTBOX_SHUTDOWN_TIMEOUT %s)", took.Round(time.Millisecond), shutdownTimeout)
	}
	if code != 0 {
		t.Errorf("worker exited with code %d after SIGTERM, want 0", code)
	}
	if took > shutdownTimeout {
		t.Errorf("worker took %s to stop, more than OUTBOX_SHUTDOWN_TIMEOUT %s", took.Round(time.Millisecond), shutdownTimeout)
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
	// Nothing the shutdown put back to NEW lost an attempt for it.
	if c, err := coll.CountDocuments(ctx, bson.D{
		{Key: events.FieldStatus, Value: events.StatusNew},
		{Key: events.FieldAttempts, Value: bson.D{{Key: "$gt", Value: 0}}},
	}); err != nil || c != 0 {
		t.Errorf("%d NEW documents with an attempt counted (error %v), want 0: a shutdown is not the event's fault", c, err)
	}
	// Every event marked PUBLISHED reached the consumer.
	published := findIDs(ctx, t, coll, bson.D{{Key: events.FieldStatus, Value: events.StatusPublished}})
	want := make([]string, len(published))
	for i, id := range published {
		want[i] = idString(id)
	}
	if err := r.waitIDs(ctx, want); err != nil {
		t.Error(err)
	}
}

// toolsScenario: stats, requeue and show against a prepared outbox.
func toolsScenario(t *testing.T, s stack) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	db := s.database(t)
	coll := db.Collection(mongo.CollectionDefault)
	now := time.Now().UTC().Truncate(time.Millisecond)

	doc := func(id any, typ string, status events.Status, extra ...bson.E) any {
		d, err := events.Draft{ID: id, Type: typ, Payload: bson.D{{Key: "n", Value: 1}}}.Document(now.Add(-10 * time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		return setFields(d, append([]bson.E{{Key: events.FieldStatus, Value: status}}, extra...)...)
	}
	failed := func(id any, typ string) any {
		return doc(id, typ, events.StatusFailed,
			bson.E{Key: events.FieldAttempts, Value: 10},
			bson.E{Key: events.FieldLastError, Value: "nacked by the broker"},
			bson.E{Key: events.FieldFailedAt, Value: now.Add(-time.Minute)})
	}
	paymentID := bson.NewObjectID()
	docs := []any{
		failed(nil, "order.created"),
		failed(nil, "order.created"),
		failed(nil, "order.created"),
		failed(paymentID, "payment.captured"),
		failed("payment-2", "payment.captured"),
		doc(nil, "order.created", events.StatusNew, bson.E{Key: events.FieldCreatedAt, Value: now.Add(-time.Hour)}),
		doc(nil, "order.created", events.StatusNew),
		doc(nil, "order.created", events.StatusProcessing,
			bson.E{Key: events.FieldWorkerID, Value: "gone-1"},
			bson.E{Key: events.FieldProcessingAt, Value: now.Add(-2 * time.Hour)}),
		doc(nil, "order.created", events.StatusProcessing,
			bson.E{Key: events.FieldWorkerID, Value: "busy-1"},
			bson.E{Key: events.FieldProcessingAt, Value: now}),
		doc(nil, "order.created", events.StatusPublished, bson.E{Key: events.FieldPublishedAt, Value: now}),
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatalf("insert: %v", err)
	}
	env := map[string]string{"OUTBOX_MONGO_URI": s.mongoURI, "OUTBOX_MONGO_DATABASE": db.Name()}

	t.Run("stats json", func(t *testing.T) {
		out := runTool(ctx, t, env, 0, "stats", "--json")
		var got struct {
			Counts              map[string]int64 `json:"counts"`
			OldestNewAgeSeconds float64          `json:"oldestNewAgeSeconds"`
			StaleProcessing     int64            `json:"staleProcessing"`
			StaleAfterSeconds   float64          `json:"staleAfterSeconds"`
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("stats --json output is not JSON: %v\n%s", err, out)
		}
		want := map[string]int64{"NEW": 2, "PROCESSING": 2, "PUBLISHED": 1, "FAILED": 5}
		if diff := cmp.Diff(want, got.Counts); diff != "" {
			t.Errorf("counts (-want +got):\n%s", diff)
		}
		if got.StaleProcessing != 1 || got.StaleAfterSeconds != 60 {
			t.Errorf("stale = %d after %gs, want 1 after 60s", got.StaleProcessing, got.StaleAfterSeconds)
		}
		if age := got.OldestNewAgeSeconds; age < 3600 || age > 3600+120 {
			t.Errorf("oldest NEW age = %gs, want about 3600s", age)
		}
	})
	t.Run("stats table", func(t *testing.T) {
		out := runTool(ctx, t, env, 0, "stats")
		for _, re := range []string{`(?m)^NEW\s+2$`, `(?m)^PROCESSING\s+2$`, `(?m)^PUBLISHED\s+1$`, `(?m)^FAILED\s+5$`,
			`(?m)^oldest NEW event\s+1h0m\d+(\.\d+)?s old$`, `(?m)^stale PROCESSING \(older than 1m0s\)\s+1$`} {
			if !regexp.MustCompile(re).MatchString(out) {
				t.Errorf("stats output does not match %s:\n%s", re, out)
			}
		}
	})
	t.Run("requeue dry run", func(t *testing.T) {
		out := runTool(ctx, t, env, 0, "requeue", "--type", "order.created", "--dry-run")
		if want := "3 FAILED events would be requeued\n"; out != want {
			t.Errorf("requeue --dry-run printed %q, want %q", out, want)
		}
		if c := countOf(ctx, t, coll, events.StatusFailed); c != 5 {
			t.Errorf("FAILED after a dry run = %d, want 5", c)
		}
	})
	t.Run("requeue by id", func(t *testing.T) {
		out := runTool(ctx, t, env, 0, "requeue", "--id", paymentID.Hex())
		if want := "requeued 1 FAILED events to NEW\n"; out != want {
			t.Errorf("requeue --id printed %q, want %q", out, want)
		}
		out = runTool(ctx, t, env, 0, "requeue", "--id", "payment-2")
		if want := "requeued 1 FAILED events to NEW\n"; out != want {
			t.Errorf("requeue --id (string id) printed %q, want %q", out, want)
		}
		if c := countOf(ctx, t, coll, events.StatusFailed); c != 3 {
			t.Errorf("FAILED after requeueing two = %d, want 3", c)
		}
	})
	t.Run("show", func(t *testing.T) {
		out := runTool(ctx, t, env, 0, "show", "--id", paymentID.Hex())
		var got struct {
			ID        bson.ObjectID `bson:"_id"`
			Type      string        `bson:"type"`
			Status    events.Status `bson:"status"`
			Attempts  int           `bson:"attempts"`
			LastError string        `bson:"lastError"`
			FailedAt  *time.Time    `bson:"failedAt"`
			Payload   bson.M        `bson:"payload"`
		}
		if err := bson.UnmarshalExtJSON([]byte(out), false, &got); err != nil {
			t.Fatalf("show output is not Extended JSON: %v\n%s", err, out)
		}
		// Requeued above: NEW with fresh attempts, lastError kept.
		if got.ID != paymentID || got.Type != "payment.captured" || got.Status != events.StatusNew ||
			got.Attempts != 0 || got.LastError != "nacked by the broker" || got.FailedAt != nil || got.Payload["n"] == nil {
			t.Errorf("show --id %s = %+v, want the requeued payment.captured event", paymentID.Hex(), got)
		}
	})
	t.Run("show unknown id", func(t *testing.T) {
		runTool(ctx, t, env, 1, "show", "--id", bson.NewObjectID().Hex())
	})
	t.Run("requeue without filter", func(t *testing.T) {
		runTool(ctx, t, env, 2, "requeue")
	})
}

// runTool runs the worker binary with args and returns its stdout,
// failing the test unless it exits with wantCode.
func runTool(ctx context.Context, t *testing.T, env map[string]string, wantCode int, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, workerBinary(t), args...)
	cmd.Env = processEnv(env)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("worker %s: %v", strings.Join(args, " "), err)
	}
	if code := cmd.ProcessState.ExitCode(); code != wantCode {
		t.Errorf("worker %s exited with %d, want %d; stderr:\n%s", strings.Join(args, " "), code, wantCode, stderr.String())
	}
	return stdout.String()
}

// claimsScenario: claimers (goroutines, each a mongo.Store with leases of
// its own) claim one backlog of n until it is empty. Each event must be
// claimed; on MongoDB, by exactly one claimer.
func claimsScenario(t *testing.T, s stack, claimers, n int) {
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout(n))
	defer cancel()
	db := s.database(t)
	ids := insertBacklog(ctx, t, db.Collection(mongo.CollectionDefault), n, "e2e.claimed")

	stores := make([]*mongo.Store, claimers)
	for i := range stores {
		stores[i] = mongo.New(s.connect(t, 4), mongo.Config{Database: db.Name()})
		if err := stores[i].Prepare(ctx); err != nil {
			t.Fatalf("prepare claimer %d: %v", i, err)
		}
	}
	claimedBy := make([][]string, claimers)
	errs := make([]error, claimers)
	var wg sync.WaitGroup
	for i, store := range stores {
		wg.Go(func() {
			workerID := fmt.Sprintf("claimer-%d", i)
			for {
				lease := events.Lease{WorkerID: workerID, Token: bson.NewObjectID().Hex(), At: time.Now().UTC().Truncate(time.Millisecond)}
				got, _, err := claimN(ctx, store, lease, 50)
				if err != nil {
					errs[i] = err
					return
				}
				if len(got) == 0 {
					// Empty means this claim lost every race, or the
					// backlog is gone: only the second ends the loop.
					left, err := store.Collection().CountDocuments(ctx, bson.D{{Key: events.FieldStatus, Value: events.StatusNew}})
					if err != nil || left == 0 {
						errs[i] = err
						return
					}
					continue
				}
				for _, c := range got {
					claimedBy[i] = append(claimedBy[i], idString(c.ID))
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("claim: %v", err)
	}
	owners := map[string]int{}
	var claims int
	for _, got := range claimedBy {
		claims += len(got)
		for _, id := range got {
			owners[id]++
		}
	}
	var overlap int
	for _, c := range owners {
		overlap += c - 1
	}
	perClaimer := make([]int, claimers)
	for i := range claimedBy {
		perClaimer[i] = len(claimedBy[i])
	}
	t.Logf("%d claimers took %v of %d events: %d claims, %d claimed twice or more", claimers, perClaimer, n, claims, overlap)
	fmt.Printf("E2E-CLAIMS-FIGURES: backend=%s claimers=%d events=%d claims=%d overlap=%d\n", s.name, claimers, n, claims, overlap)
	for _, id := range ids {
		if owners[id] == 0 {
			t.Errorf("event %s was never claimed", id)
		}
	}
	if len(owners) != n {
		t.Errorf("claimed %d distinct events, want %d", len(owners), n)
	}
	if s.atomicClaims && overlap != 0 {
		t.Errorf("%d events claimed by more than one claimer on MongoDB, want none", overlap)
	}
}

// ---------------------------------------------------------------------------
// Worker processes
// ---------------------------------------------------------------------------

// workerBin is the worker binary, built once per test binary.
var workerBin struct {
	once sync.Once
	dir  string
	path string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if workerBin.dir != "" {
		_ = os.RemoveAll(workerBin.dir)
	}
	os.Exit(code)
}

// workerBinary builds this package once per test binary and returns the
// path of the executable. It lives in a directory of its own, removed by
// TestMain, since every test of the binary uses it.
func workerBinary(t testing.TB) string {
	t.Helper()
	workerBin.once.Do(func() {
		workerBin.dir, workerBin.err = os.MkdirTemp("", "outbox-worker-e2e-")
		if workerBin.err != nil {
			return
		}
		workerBin.path = filepath.Join(workerBin.dir, "worker")
		// go test puts its own go command first on PATH.
		out, err := exec.Command("go", "build", "-o", workerBin.path, ".").CombinedOutput()
		if err != nil {
			workerBin.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if workerBin.err != nil {
		t.Fatalf("build the worker: %v", workerBin.err)
	}
	return workerBin.path
}

// processEnv is this process's environment without any OUTBOX_ variable,
// plus env.
func processEnv(env map[string]string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOX_") {
			out = append(out, kv)
		}
	}
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

// workerProc is one `worker run` process.
type workerProc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has exited
}

// startWorker starts `worker run` with env; its output goes to a file in
// t.TempDir. In t.Cleanup the process is killed if it still runs, and the
// end of its log is printed if the test failed.
func startWorker(t *testing.T, name string, env map[string]string) *workerProc {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(workerBinary(t), "run")
	cmd.Env = processEnv(env)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &workerProc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait() // the exit status is read from cmd.ProcessState
		_ = logFile.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s: last lines of its log:\n%s", name, p.tail(30))
		}
	})
	return p
}

func (p *workerProc) signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return fmt.Errorf("%s has exited (%v) before %v", p.name, p.cmd.ProcessState, sig)
	default:
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal %s: %w", p.name, err)
	}
	return nil
}

// wait waits up to timeout for the process to exit and returns its exit
// code (-1 when a signal killed it).
func (p *workerProc) wait(timeout time.Duration) (code int, exited bool) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode(), true
	case <-timer.C:
		return 0, false
	}
}

// tail returns the last n lines of the process's log.
func (p *workerProc) tail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// stopWorkers sends SIGTERM to every process and checks that each exits 0
// within the shutdown timeout.
func stopWorkers(t *testing.T, procs ...*workerProc) {
	t.Helper()
	for _, p := range procs {
		if err := p.signal(syscall.SIGTERM); err != nil {
			t.Error(err)
		}
	}
	for _, p := range procs {
		code, exited := p.wait(shutdownTimeout + 5*time.Second)
		switch {
		case !exited:
			t.Errorf("%s still running %s after SIGTERM", p.name, shutdownTimeout+5*time.Second)
		case code != 0:
			t.Errorf("%s exited with code %d after SIGTERM, want 0", p.name, code)
		}
	}
}

// ---------------------------------------------------------------------------
// Events and documents
// ---------------------------------------------------------------------------

// insertBacklog inserts n NEW events of type typ, insertChunk per
// InsertMany, and returns their ids as message ids (ObjectID hex).
func insertBacklog(ctx context.Context, t *testing.T, coll *driver.Collection, n int, typ string) []string {
	t.Helper()
	ids := make([]string, 0, n)
	docs := make([]any, 0, insertChunk)
	for i := range n {
		d, err := events.Draft{
			Type:          typ,
			AggregateType: "e2e",
			AggregateID:   strconv.Itoa(i),
			Payload:       bson.D{{Key: "n", Value: i}},
		}.Document(time.Now())
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, idString(d[0].Value))
		docs = append(docs, d)
		if len(docs) == insertChunk || i == n-1 {
			if _, err := coll.InsertMany(ctx, docs); err != nil {
				t.Fatalf("insert events %d..%d: %v", i+1-len(docs), i, err)
			}
			docs = docs[:0]
		}
	}
	return ids
}

// setFields returns d with each field of kv set: replaced where d has it,
// appended where not.
func setFields(d bson.D, kv ...bson.E) bson.D {
	for _, e := range kv {
		i := slices.IndexFunc(d, func(x bson.E) bool { return x.Key == e.Key })
		if i >= 0 {
			d[i] = e
		} else {
			d = append(d, e)
		}
	}
	return d
}

// idString is an event id as its message id.
func idString(id any) string {
	switch v := id.(type) {
	case bson.ObjectID:
		return v.Hex()
	case string:
		return v
	default:
		return fmt.Sprint(v)
	}
}

func findIDs(ctx context.Context, t *testing.T, coll *driver.Collection, filter bson.D) []any {
	t.Helper()
	cur, err := coll.Find(ctx, filter, options.Find().SetProjection(bson.D{{Key: events.FieldID, Value: 1}}))
	if err != nil {
		t.Fatalf("find ids: %v", err)
	}
	var docs []struct {
		ID any `bson:"_id"`
	}
	if err := cur.All(ctx, &docs); err != nil {
		t.Fatalf("read ids: %v", err)
	}
	ids := make([]any, len(docs))
	for i, d := range docs {
		ids[i] = d.ID
	}
	return ids
}

func countOf(ctx context.Context, t *testing.T, coll *driver.Collection, status events.Status) int64 {
	t.Helper()
	n, err := coll.CountDocuments(ctx, bson.D{{Key: events.FieldStatus, Value: status}})
	if err != nil {
		t.Fatalf("count %s: %v", status, err)
	}
	return n
}

// statusCounts counts documents by status, for failure messages and logs.
func statusCounts(t *testing.T, coll *driver.Collection) map[events.Status]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 30*time.Second)
	defer cancel()
	out := map[events.Status]int64{}
	for _, s := range events.Statuses {
		out[s] = countOf(ctx, t, coll, s)
	}
	return out
}

// waitCount waits until filter matches want documents.
func waitCount(ctx context.Context, t *testing.T, coll *driver.Collection, filter bson.D, want int64) {
	t.Helper()
	var got int64
	err := poll(ctx, pollEvery, func() (bool, error) {
		var err error
		got, err = coll.CountDocuments(ctx, filter)
		return got == want, err
	})
	if err != nil {
		t.Fatalf("waiting for %d documents matching %v (last count %d): %v; by status: %v", want, filter, got, err, statusCounts(t, coll))
	}
}

// poll calls cond every interval until it reports done or fails, or ctx
// ends.
func poll(ctx context.Context, every time.Duration, cond func() (bool, error)) error {
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		done, err := cond()
		if err != nil || done {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ticker.C:
		}
	}
}

// ---------------------------------------------------------------------------
// The consumer
// ---------------------------------------------------------------------------

// receiver counts the deliveries of one exchange by message id.
type receiver struct {
	mu          sync.Mutex
	counts      map[string]int
	total       int
	first, last time.Time
}

// consume binds a queue to exchange (see testenv.Consume) and counts what
// arrives. Call it before starting workers.
func consume(t *testing.T, s stack, exchange string) *receiver {
	t.Helper()
	r := &receiver{counts: map[string]int{}}
	done := make(chan struct{})
	started := false
	// Registered before Consume's cleanup, so it runs after it: the
	// deliveries channel is closed by then and the goroutine returns.
	t.Cleanup(func() {
		if started {
			<-done
		}
	})
	deliveries := testenv.Consume(t, s.amqpURL, exchange)
	started = true
	go func() {
		defer close(done)
		for d := range deliveries {
			r.add(d)
		}
	}()
	return r
}

func (r *receiver) add(d amqp.Delivery) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if r.total == 0 {
		r.first = now
	}
	r.last = now
	r.total++
	r.counts[d.MessageId]++
}

// snapshot returns the distinct message ids, the deliveries, and when the
// last one arrived.
func (r *receiver) snapshot() (distinct, total int, last time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.counts), r.total, r.last
}

func (r *receiver) distinct() int {
	d, _, _ := r.snapshot()
	return d
}

// waitDistinct waits until n distinct messages have arrived.
func (r *receiver) waitDistinct(ctx context.Context, n int) error {
	err := poll(ctx, pollEvery, func() (bool, error) { return r.distinct() >= n, nil })
	if err != nil {
		d, total, _ := r.snapshot()
		return fmt.Errorf("%d of %d events received (%d deliveries): %w", d, n, total, err)
	}
	return nil
}

// waitIDs waits until every id has arrived.
func (r *receiver) waitIDs(ctx context.Context, ids []string) error {
	var missing []string
	err := poll(ctx, pollEvery, func() (bool, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		missing = missing[:0]
		for _, id := range ids {
			if r.counts[id] == 0 {
				missing = append(missing, id)
			}
		}
		return len(missing) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("%d of %d events never arrived (e.g. %v): %w", len(missing), len(ids), missing[:min(len(missing), 5)], err)
	}
	return nil
}

// drain waits, once every publisher has stopped, for deliveries still on
// their way: until none has arrived for a second, at most 15 s.
func (r *receiver) drain(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	_, total, _ := r.snapshot()
	quietSince := time.Now()
	_ = poll(ctx, pollEvery, func() (bool, error) {
		if _, now, _ := r.snapshot(); now != total {
			total, quietSince = now, time.Now()
		}
		return time.Since(quietSince) >= time.Second, nil
	})
}

// checkExactly checks that the message ids received are exactly ids.
func (r *receiver) checkExactly(t *testing.T, ids []string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
		if r.counts[id] == 0 {
			t.Errorf("event %s never arrived", id)
		}
	}
	for id := range r.counts {
		if !want[id] {
			t.Errorf("message %q arrived but no such event was inserted", id)
		}
	}
}

// ---------------------------------------------------------------------------
// Settings of the tests
// ---------------------------------------------------------------------------

func e2eEvents(t *testing.T) int {
	def := e2eEventsDefault
	if raceEnabled() {
		// The race detector slows embedded FerretDB, which runs in this
		// process, several times over: with 3,000 events a batch of 500
		// outlasts the 15 s stale threshold, recovery takes healthy
		// batches back, and the scenarios thrash instead of testing.
		def = e2eEventsRace
	}
	return envInt(t, envE2EEvents, def, 100, 1_000_000)
}

// raceEnabled reports whether this test binary was built with -race.
func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

func e2eWorkers(t *testing.T) int {
	return envInt(t, envE2EWorkers, e2eWorkersDefault, 1, 16)
}

func envInt(t *testing.T, name string, def, lo, hi int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		t.Fatalf("%s=%q: want a whole number from %d to %d", name, v, lo, hi)
	}
	return n
}

// e2eTimeout bounds a scenario over n events: FerretDB relays ~100-150
// events/s here, slower while other tests run.
func e2eTimeout(n int) time.Duration {
	return 2*time.Minute + time.Duration(n)*30*time.Millisecond
}
