package claim

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/broker"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/mongo/mongotest"
)

// waitFor bounds every wait on a server in these tests.
const waitFor = 30 * time.Second

var discard = slog.New(slog.DiscardHandler)

// The adapters the worker wires in satisfy what the claimer declares.
var (
	_ Store     = (*mongo.Store)(nil)
	_ Publisher = (*broker.Publisher)(nil)
)

// testBundle is what a test of the relay from outbox to queue works on: a
// prepared store on a database of its own, and an exchange of its own
// with a queue bound to it. The outage tests' outageRig adds the links
// they cut.
type testBundle struct {
	store      *mongo.Store
	coll       *driver.Collection // the store's outbox
	exchange   string
	deliveries <-chan amqp.Delivery // the queue's
}

// setup binds the queue before the test starts a publisher on the
// exchange, so that at cleanup the publisher stops before the queue and
// exchange are deleted.
func setup(t *testing.T) testBundle {
	t.Helper()
	store := mongotest.Store(t)
	exchange := testenv.UniqueName(t, "ex_")
	return testBundle{store: store, coll: store.Collection(), exchange: exchange,
		deliveries: testenv.Consume(t, testenv.AMQPURL(t), exchange)}
}

// newPublisher returns a connected publisher on exchange, stopped in
// t.Cleanup. The exchange is deleted after the publisher stops.
func newPublisher(t *testing.T, exchange string) *broker.Publisher {
	t.Helper()
	url := testenv.AMQPURL(t)
	deleteExchangeAtCleanup(t, url, exchange)
	return startPublisher(t, broker.Config{URL: url, Exchange: exchange, Logger: discard})
}

// startPublisher starts a publisher on cfg, the shared broker's URL if cfg
// has none, stops it at cleanup, and returns it once it is ready.
func startPublisher(t *testing.T, cfg broker.Config) *broker.Publisher {
	t.Helper()
	if cfg.URL == "" {
		cfg.URL = testenv.AMQPURL(t)
	}
	p, err := broker.New(cfg)
	if err != nil {
		t.Fatalf("broker.New: %v", err)
	}
	if err := p.Start(t.Context()); err != nil {
		t.Fatalf("publisher Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		_ = p.Stop(ctx)
	})
	testenv.WaitReady(t, p.Ready)
	return p
}

// deleteExchangeAtCleanup removes an exchange the publisher declared, for
// the tests that bind no queue to it (testenv.Consume cleans up its own).
func deleteExchangeAtCleanup(t *testing.T, url, exchange string) {
	t.Helper()
	t.Cleanup(func() {
		conn, err := amqp.Dial(url)
		if err != nil {
			return
		}
		defer conn.Close()
		if ch, err := conn.Channel(); err == nil {
			_ = ch.ExchangeDelete(exchange, false, false)
		}
	})
}

// newClaimer returns a Claimer for tests with its own metrics.
func newClaimer(t testing.TB, store Store, pub Publisher, cfg Config) (*Claimer, *metrics.Metrics) {
	t.Helper()
	if cfg.WorkerID == "" {
		cfg.WorkerID = "worker-a"
	}
	cfg.Logger = discard
	cfg.Metrics = metrics.New(nil)
	c, err := New(store, pub, cfg)
	if err != nil {
		t.Fatalf("claim.New: %v", err)
	}
	return c, cfg.Metrics
}

// insertEvents inserts n valid NEW events of type typ, one millisecond
// apart and in the past, and returns their ids oldest first.
func insertEvents(t *testing.T, coll *driver.Collection, n int, typ string) []string {
	t.Helper()
	start := time.Now().Add(-time.Hour)
	ids := make([]string, n)
	docs := make([]any, n)
	for i := range n {
		id := bson.NewObjectID()
		d := events.Draft{ID: id, Type: typ, AggregateType: "order", AggregateID: fmt.Sprint(i),
			Payload: bson.D{{Key: "n", Value: i}}}
		doc, err := d.Document(start.Add(time.Duration(i) * time.Millisecond))
		if err != nil {
			t.Fatalf("draft %d: %v", i, err)
		}
		ids[i], docs[i] = id.Hex(), doc
	}
	if _, err := coll.InsertMany(t.Context(), docs); err != nil {
		t.Fatalf("insert %d events: %v", n, err)
	}
	return ids
}

// stored is what the tests read back of an event: its key, its status and
// the fields the worker manages. (events.Event would refuse a poison
// event's type or aggregate id.)
type stored struct {
	ID              any           `bson:"_id"`
	AggregateID     any           `bson:"aggregateId"`
	Status          events.Status `bson:"status"`
	events.Delivery `bson:",inline"`
}

// allEvents returns every stored event by its _id as a message id.
func allEvents(t *testing.T, coll *driver.Collection) map[string]stored {
	t.Helper()
	cur, err := coll.Find(t.Context(), bson.D{})
	if err != nil {
		t.Fatalf("find events: %v", err)
	}
	var all []stored
	if err := cur.All(t.Context(), &all); err != nil {
		t.Fatalf("read events: %v", err)
	}
	out := make(map[string]stored, len(all))
	for _, e := range all {
		out[testenv.MessageID(e.ID)] = e
	}
	return out
}

func oid(t *testing.T, hex string) bson.ObjectID {
	t.Helper()
	id, err := bson.ObjectIDFromHex(hex)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func once(ids []string) map[string]int {
	out := make(map[string]int, len(ids))
	for _, id := range ids {
		out[id] = 1
	}
	return out
}

func runOnce(t *testing.T, c *Claimer) bool {
	t.Helper()
	more, err := c.runOnce(t.Context())
	if err != nil {
		t.Fatalf("runOnce: %v", err)
	}
	return more
}
