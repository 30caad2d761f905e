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
	"context"
	"os"
	"runtime/debug"
	"strconv"
	"testing"
	"time"

	driver "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

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
)

// TestE2E runs every end-to-end scenario against embedded FerretDB (or the
// MongoDB in OUTBOX_TEST_MONGO_URI) and the local RabbitMQ.
func TestE2E(t *testing.T) {
	t.Parallel()
	runScenarios(t, localStack(t), e2eWorkers(t))
}

// localStack is embedded FerretDB (or the MongoDB in OUTBOX_TEST_MONGO_URI)
// and the local RabbitMQ.
func localStack(t *testing.T) stack {
	s := stack{
		name:         "ferretdb",
		mongoURI:     testenv.MongoURI(t),
		amqpURL:      testenv.AMQPURL(t),
		atomicClaims: !testenv.IsFerretDB(),
	}
	if s.atomicClaims {
		s.name = "mongodb"
	}
	return s
}

// subtest is a named part of a test.
type subtest struct {
	name string
	run  func(t *testing.T)
}

// runParallel runs each subtest in parallel with the others.
func runParallel(t *testing.T, subtests []subtest) {
	for _, st := range subtests {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			st.run(t)
		})
	}
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
	runParallel(t, []subtest{
		{"relay", func(t *testing.T) { relayScenario(t, s, workers, n) }},
		{"kill", func(t *testing.T) { killScenario(t, s, mid) }},
		{"sigterm", func(t *testing.T) { shutdownScenario(t, s, mid) }},
		{"tools", func(t *testing.T) { toolsScenario(t, s) }},
		{"claims", func(t *testing.T) { claimsScenario(t, s, 4, 1000) }},
		{"friendly", func(t *testing.T) { friendlyScenario(t, s, 300) }},
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

// relayed gives a scenario its own database, the outbox collection in
// it, an exchange and a receiver bound to it before any worker starts.
func (s stack) relayed(t *testing.T) (*driver.Database, *driver.Collection, string, *receiver) {
	t.Helper()
	db := s.database(t)
	exchange := testenv.UniqueName(t, "ex_")
	return db, db.Collection(mongo.CollectionDefault), exchange, consume(t, s, exchange)
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

// relayEnv is workerEnv for the scenarios that test relaying or stopping,
// not recovery: the stale threshold at the worker's default (a minute).
// The threshold of a deployment must exceed its database's slowest claim
// write; the 15 s the recovery scenarios need to stay quick left terms of
// 7.5 s, which on a busy host FerretDB's claim writes (a scan of the whole
// collection per update) outlasted over and over; in the SIGTERM scenario
// the releases of such claims timed out too, and took the whole stop.
func (s stack) relayEnv(db, exchange, workerID string) map[string]string {
	env := s.workerEnv(db, exchange, workerID)
	env["OUTBOX_STALE_AFTER"] = "1m"
	return env
}

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

// e2eTimeout bounds a scenario over n events: 30 ms an event leaves room
// for FerretDB, the slow side here (docs/performance.md has its rates),
// slower still while other tests run.
func e2eTimeout(n int) time.Duration {
	return 2*time.Minute + time.Duration(n)*30*time.Millisecond
}
