package main

// The container suite: the end-to-end scenarios of e2e_test.go and
// ordering_e2e_test.go, plus the transaction paths (the PUBLISHED write,
// and a producer's events.Insert), against a real MongoDB (a single-node
// replica set, so that transactions exist) and RabbitMQ, started with
// testcontainers-go.
// It needs a Docker engine and skips, saying so, where there is none.
// On MongoDB claims are atomic: any duplicate delivery fails it.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	driver "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/mongo/mongotest"
)

func TestContainers(t *testing.T) {
	t.Parallel()
	mongoURI, amqpURL := testenv.Containers(t)
	s := stack{name: "mongodb", mongoURI: mongoURI, amqpURL: amqpURL, atomicClaims: true}
	runScenarios(t, s, 3)
	runParallel(t, []subtest{
		{"transactions", func(t *testing.T) { transactionScenario(t, s) }},
		{"producer", func(t *testing.T) { producerScenario(t, s) }},
		{"claim-explain", func(t *testing.T) { claimExplainScenario(t, s) }},
		{"periodic-explain", func(t *testing.T) { periodicExplainScenario(t, s) }},
		{"ownership-fencing", func(t *testing.T) { ownershipFencingScenario(t, s, 3000) }},
		// Per-aggregate order, a kill, unroutable retries and a FAILED
		// event on a replica set (ordering_e2e_test.go).
		{"ordering", func(t *testing.T) { runOrderingScenarios(t, s) }},
		{"wakeup", func(t *testing.T) { wakeupScenario(t, s) }},
		// One change stream per database wakes each outbox of a fleet.
		{"fleet-wakeup", func(t *testing.T) { fleetWakeupScenario(t, s) }},
		// From the last release and back, with a SIGKILL each way, while
		// the two versions share the fence (upgrade_e2e_test.go).
		{"rolling-upgrade", func(t *testing.T) { rollingUpgradeScenario(t, s) }},
	})
}

// claimExplainScenario: with 10,000 events backing off at the head of the
// outbox, the claim's finds examine about as many documents as they
// return. It explains the very find commands Claim sends.
func claimExplainScenario(t *testing.T, s stack) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var (
		mu    sync.Mutex
		finds []bson.Raw
	)
	monitor := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		if e.CommandName == "find" {
			mu.Lock()
			defer mu.Unlock()
			finds = append(finds, slices.Clone(e.Command))
		}
	}}
	client := s.connect(t, testenv.ClientMaxPoolSize, func(o *options.ClientOptions) { o.SetMonitor(monitor) })
	db := uniqueDatabase(t, client)
	store := mongo.New(client, mongo.Config{Database: db.Name()})
	if err := store.Prepare(ctx); err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	coll := store.Collection()
	now := time.Now().UTC().Truncate(time.Millisecond)
	start := now.Add(-time.Hour)
	const backingOff, fresh, limit = 10000, 40, 20
	docs := make([]any, 0, backingOff+fresh)
	for i := range backingOff {
		docs = append(docs, bson.D{{Key: "_id", Value: fmt.Sprintf("wait-%05d", i)}, {Key: "type", Value: "t"},
			{Key: "payload", Value: bson.D{}}, {Key: "status", Value: "NEW"}, {Key: "attempts", Value: 1},
			{Key: "createdAt", Value: start.Add(time.Duration(i) * time.Millisecond)},
			{Key: "retryAt", Value: now.Add(time.Hour)}})
	}
	var want []string
	for i := range fresh {
		id := fmt.Sprintf("new-%02d", i)
		d := bson.D{{Key: "_id", Value: id}, {Key: "type", Value: "t"}, {Key: "payload", Value: bson.D{}},
			{Key: "status", Value: "NEW"}, {Key: "createdAt", Value: start.Add(time.Duration(backingOff+i) * time.Millisecond)}}
		if i%4 == 0 { // due retries among the never-retried ones
			d = append(d, bson.E{Key: "retryAt", Value: now.Add(-time.Minute)}, bson.E{Key: "attempts", Value: 1})
		}
		docs = append(docs, d)
		if len(want) < limit {
			want = append(want, id)
		}
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatalf("insert: %v", err)
	}
	mu.Lock()
	finds = nil
	mu.Unlock()
	res, err := store.Claim(ctx, events.Lease{WorkerID: "w", Token: "t", At: now}, events.ClaimLimit{Events: limit})
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	got := mongotest.MessageIDs(res.Claimed)
	slices.Sort(got)
	if !slices.Equal(want, got) {
		t.Errorf("claimed %v, want %v", got, want)
	}
	mu.Lock()
	sent := finds
	mu.Unlock()
	if len(sent) != 2 {
		t.Fatalf("Claim sent %d finds, want 2", len(sent))
	}
	for _, cmd := range sent {
		var find bson.D
		for _, e := range mustElements(t, cmd) {
			switch e.Key() {
			case "find", "filter", "sort", "limit", "hint", "batchSize":
				find = append(find, bson.E{Key: e.Key(), Value: e.Value()})
			}
		}
		var out struct {
			Stats struct {
				Returned     int `bson:"nReturned"`
				DocsExamined int `bson:"totalDocsExamined"`
				KeysExamined int `bson:"totalKeysExamined"`
			} `bson:"executionStats"`
		}
		explain := bson.D{{Key: "explain", Value: find}, {Key: "verbosity", Value: "executionStats"}}
		if err := db.RunCommand(ctx, explain).Decode(&out); err != nil {
			t.Fatalf("explain %v: %v", find, err)
		}
		st := out.Stats
		if st.DocsExamined > st.Returned+5 || st.KeysExamined > st.Returned+5 {
			t.Errorf("find %v examined %d documents and %d keys to return %d; want at most 5 more",
				find, st.DocsExamined, st.KeysExamined, st.Returned)
		}
	}
}

func mustElements(t *testing.T, doc bson.Raw) []bson.RawElement {
	t.Helper()
	els, err := doc.Elements()
	if err != nil {
		t.Fatal(err)
	}
	return els
}

// producerScenario: events.Insert inside a producer's transaction commits
// with the business document, and rolls back with it: the reason for an
// outbox.
func producerScenario(t *testing.T, s stack) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	client := s.connect(t, testenv.ClientMaxPoolSize)
	db := uniqueDatabase(t, client)
	orders, outbox := db.Collection("orders"), db.Collection(mongo.CollectionDefault)
	// Collections must exist before a transaction writes to them on MongoDB
	// before 4.4; creating them keeps the scenario about the transaction.
	for _, c := range []string{"orders", mongo.CollectionDefault} {
		if err := db.CreateCollection(ctx, c); err != nil {
			t.Fatalf("create %s: %v", c, err)
		}
	}
	sess, err := client.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.EndSession(ctx)

	write := func(orderID string, fail error) error {
		_, err := sess.WithTransaction(ctx, func(ctx context.Context) (any, error) {
			if _, err := orders.InsertOne(ctx, bson.D{{Key: "_id", Value: orderID}}); err != nil {
				return nil, err
			}
			if _, err := events.Insert(ctx, outbox, events.Draft{
				ID: "order-" + orderID + "-created", Type: "order.created",
				AggregateType: "order", AggregateID: orderID, Payload: bson.D{{Key: "id", Value: orderID}},
			}); err != nil {
				return nil, err
			}
			return nil, fail
		})
		return err
	}
	if err := write("o-1", nil); err != nil {
		t.Fatalf("committed transaction: %v", err)
	}
	rollback := errors.New("payment declined")
	if err := write("o-2", rollback); !errors.Is(err, rollback) {
		t.Fatalf("aborted transaction = %v, want %v", err, rollback)
	}
	for _, tt := range []struct {
		coll *driver.Collection
		id   string
		want int64
	}{
		{orders, "o-1", 1}, {outbox, "order-o-1-created", 1},
		{orders, "o-2", 0}, {outbox, "order-o-2-created", 0},
	} {
		n, err := tt.coll.CountDocuments(ctx, bson.D{{Key: "_id", Value: tt.id}})
		if err != nil || n != tt.want {
			t.Errorf("%s %s: %d documents, %v; want %d", tt.coll.Name(), tt.id, n, err, tt.want)
		}
	}
	var e events.Event
	if err := outbox.FindOne(ctx, bson.D{{Key: "_id", Value: "order-o-1-created"}}).Decode(&e); err != nil {
		t.Fatalf("read the committed event: %v", err)
	}
	if e.Status != events.StatusNew || e.Type != "order.created" || e.CreatedAt.IsZero() {
		t.Errorf("committed event = %+v, want NEW order.created with createdAt", e)
	}
}

// transactionScenario: on a replica set the store finds transactions, and
// the PUBLISHED write runs in one (autocommit false, then a commit) and
// stays fenced by the lease.
func transactionScenario(t *testing.T, s stack) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	var (
		mu       sync.Mutex
		commands []*event.CommandStartedEvent
	)
	monitor := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		mu.Lock()
		defer mu.Unlock()
		commands = append(commands, e)
	}}
	recorded := func() []*event.CommandStartedEvent {
		mu.Lock()
		defer mu.Unlock()
		out := commands
		commands = nil
		return out
	}
	client := s.connect(t, testenv.ClientMaxPoolSize, func(o *options.ClientOptions) { o.SetMonitor(monitor) })
	db := uniqueDatabase(t, client)
	store := mongo.New(client, mongo.Config{Database: db.Name()})
	if err := store.Prepare(ctx); err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	if !store.SupportsTransactions() {
		t.Fatal("SupportsTransactions = false on a replica set, want true")
	}
	insertBacklog(ctx, t, store.Collection(), 10, "e2e.transacted")

	at := time.Now().UTC().Truncate(time.Millisecond)
	a := events.Lease{WorkerID: "worker-a", Token: "token-a", At: at}
	b := events.Lease{WorkerID: "worker-b", Token: "token-b", At: at}
	claimedA, _, err := claimN(ctx, store, a, 6)
	if err != nil || len(claimedA) != 6 {
		t.Fatalf("Claim(a, 6) = %d events, %v; want 6", len(claimedA), err)
	}
	claimedB, _, err := claimN(ctx, store, b, 6)
	if err != nil || len(claimedB) != 4 {
		t.Fatalf("Claim(b, 6) = %d events, %v; want the other 4", len(claimedB), err)
	}

	recorded()
	n, err := store.MarkPublished(ctx, a, mongotest.IDs(claimedA), at)
	if err != nil || n != 6 {
		t.Fatalf("MarkPublished(a) = %d, %v; want 6", n, err)
	}
	var names []string
	var inTxn bool
	for _, c := range recorded() {
		names = append(names, c.CommandName)
		if c.CommandName == "update" {
			autocommit, err := c.Command.LookupErr("autocommit")
			inTxn = err == nil && autocommit.Type == bson.TypeBoolean && !autocommit.Boolean()
		}
	}
	if !inTxn || !slices.Contains(names, "commitTransaction") {
		t.Errorf("MarkPublished sent %v: want an update with autocommit false, then commitTransaction", names)
	}

	// Fenced inside the transaction too: lease a cannot mark b's events.
	n, err = store.MarkPublished(ctx, a, mongotest.IDs(claimedB), at)
	if err != nil || n != 0 {
		t.Errorf("MarkPublished(a, b's events) = %d, %v; want 0", n, err)
	}
	if c := countOf(ctx, t, store.Collection(), events.StatusProcessing); c != 4 {
		t.Errorf("PROCESSING after a's stray mark = %d, want b's 4", c)
	}
	n, err = store.MarkPublished(ctx, b, mongotest.IDs(claimedB), at)
	if err != nil || n != 4 {
		t.Errorf("MarkPublished(b) = %d, %v; want 4", n, err)
	}
	if c := countOf(ctx, t, store.Collection(), events.StatusPublished); c != 10 {
		t.Errorf("PUBLISHED = %d, want 10", c)
	}
}

// claimN claims up to n events with no byte bound, as Claim did before
// it took a ClaimLimit.
func claimN(ctx context.Context, s *mongo.Store, lease events.Lease, n int) ([]events.Claimed, bool, error) {
	res, err := s.Claim(ctx, lease, events.ClaimLimit{Events: n})
	return res.Claimed, res.More, err
}
