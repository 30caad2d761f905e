package claim

import (
	"bytes"
	"context"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/broker"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/service"
)

// Fault injection at the relay level: a real store and a real publisher,
// each reaching its server through a testenv proxy that the test cuts in
// the middle of a backlog. The figures each test logs with the
// FAULT-FIGURES: prefix are the recovery times the outage sections of the
// operations guide quote.

const (
	outageEvents    = 2000
	outageBatchSize = 100
	// outageCutAt is the call (publish or mark) during which the link is
	// cut: the backlog is a third through by then.
	outageCutAt = 7
	// outageDrainTimeout bounds the wait for the whole backlog after a
	// Restore: a hang guard, not a budget. FerretDB is the slow side here
	// (docs/performance.md has its rates); the backlog drains in well
	// under a minute on a quiet host, in three beside two busy loops.
	outageDrainTimeout = 6 * time.Minute
	outageWait         = 20 * time.Second
	outageWorkerID     = "outage-worker"
	// outageStaleAfter is the claimer's lease and the recovery job's stale
	// threshold: a batch whose outcome cannot be written within it is left
	// to recovery. Beside two busy loops FerretDB's mark of a batch of 100
	// took more than 10 s, and the run before the cut failed: the threshold
	// must leave a healthy write its time, as in production (60 s).
	outageStaleAfter = 20 * time.Second
)

// outageRig is one relay whose database and broker links can be cut.
type outageRig struct {
	t         *testing.T
	events    *driver.Collection // direct, for setup and assertions
	store     *mongo.Store       // through dbProxy
	dbProxy   *testenv.Proxy
	pub       *broker.Publisher // through amqpProxy
	amqpProxy *testenv.Proxy
	inbox     *inbox
	metrics   *metrics.Metrics
	logger    *slog.Logger
	ids       []string // message ids of the backlog, oldest first
}

func newOutageRig(t *testing.T) *outageRig {
	t.Helper()
	ctx := t.Context()
	r := &outageRig{t: t, metrics: metrics.New(nil), logger: outageLogger(t)}

	// Database: assertions go direct, the store goes through the proxy.
	db := testenv.Database(t)
	r.events = db.Collection(mongo.CollectionDefault)
	var client *driver.Client
	client, r.dbProxy = testenv.ProxiedClient(t)
	r.store = mongo.New(client, mongo.Config{Database: db.Name(), Logger: r.logger})
	if err := r.store.Prepare(ctx); err != nil {
		t.Fatalf("Prepare through the proxy: %v", err)
	}

	// Broker: the consumer goes direct, the publisher through the proxy.
	amqpURL := testenv.AMQPURL(t)
	exchange := testenv.UniqueName(t, "ex_")
	r.inbox = startInbox(t, testenv.Consume(t, amqpURL, exchange))
	var proxiedAMQP string
	proxiedAMQP, r.amqpProxy = testenv.Proxied(t, amqpURL)
	r.pub = startPublisher(t, broker.Config{
		URL: proxiedAMQP, Exchange: exchange, Logger: r.logger,
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 500 * time.Millisecond,
	})

	r.insertBacklog()
	return r
}

// outageLogger logs through t until the test's last cleanup, and never
// after: background goroutines may still log while they stop.
func outageLogger(t *testing.T) *slog.Logger {
	w := &outageLogWriter{t: t}
	t.Cleanup(w.close) // registered first, so it runs last
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type outageLogWriter struct {
	mu     sync.Mutex
	t      *testing.T
	closed bool
}

func (w *outageLogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.t.Log(string(bytes.TrimRight(p, "\n")))
	}
	return len(p), nil
}

func (w *outageLogWriter) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
}

func (r *outageRig) insertBacklog() {
	r.t.Helper()
	base := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	docs := make([]any, 0, outageEvents)
	for i := range outageEvents {
		id := bson.NewObjectID()
		r.ids = append(r.ids, id.Hex())
		docs = append(docs, bson.D{
			{Key: events.FieldID, Value: id},
			{Key: events.FieldType, Value: "order.created"},
			{Key: events.FieldPayload, Value: bson.D{{Key: "n", Value: int32(i)}}},
			{Key: events.FieldStatus, Value: events.StatusNew},
			{Key: events.FieldCreatedAt, Value: base.Add(time.Duration(i) * time.Millisecond)},
		})
	}
	for start := 0; start < len(docs); start += 500 {
		if _, err := r.events.InsertMany(r.t.Context(), docs[start:min(start+500, len(docs))]); err != nil {
			r.t.Fatalf("insert backlog: %v", err)
		}
	}
}

func (r *outageRig) newClaimer(store Store, pub Publisher) *Claimer {
	r.t.Helper()
	c, err := New(store, pub, Config{
		WorkerID:       outageWorkerID,
		Schedule:       "@every 100ms",
		BatchSize:      outageBatchSize,
		PublishTimeout: outageStaleAfter / 2,
		StaleAfter:     outageStaleAfter,
		Archetype:      service.Archetype{Logger: r.logger, Metrics: r.metrics},
	})
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), outageWait)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			r.t.Errorf("claimer Stop: %v", err)
		}
	})
	return c
}

// drainAndStop waits until c, running on its schedule, has marked the whole
// backlog PUBLISHED, then stops it. It returns how long after restored the
// backlog was drained.
func (r *outageRig) drainAndStop(c *Claimer, restored time.Time) time.Duration {
	r.t.Helper()
	r.poll(outageDrainTimeout, "backlog PUBLISHED after Restore", r.allMarked)
	drained := time.Since(restored)
	ctx, cancel := context.WithTimeout(r.t.Context(), outageWait)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		r.t.Fatalf("claimer Stop: %v", err)
	}
	return drained
}

// docs reads every event, directly from the database.
func (r *outageRig) docs() map[string]stored {
	r.t.Helper()
	return allEvents(r.t, r.events)
}

func (r *outageRig) count(status events.Status) int {
	r.t.Helper()
	n, err := r.events.CountDocuments(r.t.Context(), bson.D{{Key: events.FieldStatus, Value: status}})
	if err != nil {
		r.t.Fatalf("count %s events: %v", status, err)
	}
	return int(n)
}

// allMarked reports whether the claimer has marked the whole backlog
// PUBLISHED. It reads the counter, not the database: polling FerretDB
// would slow the relay it measures. One worker marks each event once.
func (r *outageRig) allMarked() bool {
	return testutil.ToFloat64(r.metrics.Published) >= outageEvents
}

// runUntil calls runOnce until done reports true, failing on any error.
func (r *outageRig) runUntil(c *Claimer, what string, done func() bool) {
	r.t.Helper()
	for i := 0; !done(); i++ {
		if i > outageEvents/outageBatchSize+5 {
			r.t.Fatalf("%s: not after %d runs", what, i)
		}
		if _, err := c.runOnce(r.t.Context()); err != nil {
			r.t.Fatalf("runOnce before the cut: %v", err)
		}
	}
}

// poll waits until cond holds, and returns how long that took. A wait
// that fails logs how the events stand.
func (r *outageRig) poll(timeout time.Duration, what string, cond func() bool) time.Duration {
	r.t.Helper()
	start := time.Now()
	defer func() {
		if r.t.Failed() {
			r.t.Logf("%s: NEW %d, PROCESSING %d, PUBLISHED %d, FAILED %d", what,
				r.count(events.StatusNew), r.count(events.StatusProcessing), r.count(events.StatusPublished), r.count(events.StatusFailed))
		}
	}()
	testenv.Eventually(r.t, timeout, func() (bool, string) { return cond(), what })
	return time.Since(start)
}

// requireAllPublishedOnce checks the end state of every outage: every
// event PUBLISHED and delivered at least once, none FAILED, no event with
// more than two attempts. It logs and returns the duplicates.
func (r *outageRig) requireAllPublishedOnce() (duplicates, maxAttempts int) {
	r.t.Helper()
	docs := r.docs()
	attempts := map[int]int{}
	for _, id := range r.ids {
		d, ok := docs[id]
		switch {
		case !ok:
			r.t.Errorf("event %s is gone", id)
			continue
		case d.Status != events.StatusPublished:
			r.t.Errorf("event %s is %s (attempts %d, lastError %q), want PUBLISHED", id, d.Status, d.Attempts, d.LastError)
		case d.Attempts > 2:
			r.t.Errorf("event %s has %d attempts, want at most 2: the outage burned attempts", id, d.Attempts)
		}
		attempts[d.Attempts]++
		maxAttempts = max(maxAttempts, d.Attempts)
	}
	r.t.Logf("attempts per event: %v (attempts: events)", attempts)
	if failed := r.count(events.StatusFailed); failed != 0 {
		r.t.Errorf("%d events FAILED because of an outage, want 0", failed)
	}

	// Confirmed means enqueued: the consumer has them all, or is about to.
	r.poll(outageWait, "every event delivered", func() bool { return r.inbox.distinct() >= len(r.ids) })
	counts := r.inbox.Counts()
	for _, id := range r.ids {
		if counts[id] == 0 {
			r.t.Errorf("event %s never delivered", id)
		}
	}
	var dupIDs []string
	for id, n := range counts {
		duplicates += n - 1
		if n > 1 {
			dupIDs = append(dupIDs, id)
		}
	}
	sort.Strings(dupIDs)
	if len(dupIDs) > 0 {
		r.t.Logf("%d duplicate deliveries of %d events, e.g. %s", duplicates, len(dupIDs), strings.Join(dupIDs[:min(3, len(dupIDs))], ", "))
	}
	return duplicates, maxAttempts
}
