package mongo_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/claim"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/mongo/mongotest"
	"github.com/outboxrelay/outbox/ops"
	"github.com/outboxrelay/outbox/recovery"
	"github.com/outboxrelay/outbox/retention"
)

// The store is what every service's narrow interface asks for.
var (
	_ claim.Store     = (*mongo.Store)(nil)
	_ recovery.Store  = (*mongo.Store)(nil)
	_ retention.Store = (*mongo.Store)(nil)
	_ ops.StatsSource = (*mongo.Store)(nil)
	_ ops.HeldSource  = (*mongo.Store)(nil)
)

// base is the tests' clock. BSON dates keep milliseconds, so every time
// written and compared is a whole millisecond.
var base = time.Date(2025, 3, 4, 12, 0, 0, 0, time.UTC)

func ago(d time.Duration) time.Time { return base.Add(-d) }

// setup returns a prepared store on a database of its own, and its collection.
func setup(t *testing.T) (*mongo.Store, *driver.Collection) {
	t.Helper()
	s := mongotest.Store(t)
	return s, s.Collection()
}

// ev, insert and statuses are mongotest's, short for the many tests below.
var (
	ev       = mongotest.Event
	insert   = mongotest.Insert
	statuses = mongotest.Statuses
)

// withType sets the event type of d.
func withType(d bson.D, typ string) bson.D {
	for i := range d {
		if d[i].Key == events.FieldType {
			d[i].Value = typ
		}
	}
	return d
}

func field(key string, value any) bson.E { return bson.E{Key: key, Value: value} }

func get(t *testing.T, coll *driver.Collection, id any) events.Event {
	t.Helper()
	var e events.Event
	if err := coll.FindOne(t.Context(), bson.D{{Key: events.FieldID, Value: id}}).Decode(&e); err != nil {
		t.Fatalf("find event %v: %v", id, err)
	}
	return e
}

// has reports whether the stored event id has the field key at all.
var has = testenv.HasField

// idString is an event's _id as a string, as the worker writes it into the
// message id.
var idString = testenv.MessageID

// ids are the claimed events' _ids as message ids.
var ids = mongotest.MessageIDs

func lease(worker string) events.Lease {
	return events.Lease{WorkerID: worker, Token: "token-" + worker, At: base}
}

func TestPrepare(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	s := mongo.New(db.Client(), mongo.Config{Database: db.Name(), Collection: "outbox_events"})
	if s.SupportsTransactions() {
		t.Error("SupportsTransactions before Prepare = true, want false (not known yet)")
	}
	for i := range 3 { // every replica prepares at start: it must be idempotent
		if err := s.Prepare(t.Context()); err != nil {
			t.Fatalf("Prepare #%d: %v", i+1, err)
		}
	}
	if got := s.Collection().Name(); got != "outbox_events" {
		t.Errorf("Collection().Name() = %q, want outbox_events", got)
	}

	cur, err := s.Collection().Indexes().List(t.Context())
	if err != nil {
		t.Fatalf("list indexes: %v", err)
	}
	var specs []struct {
		Name string `bson:"name"`
		Key  bson.D `bson:"key"`
	}
	if err := cur.All(t.Context(), &specs); err != nil {
		t.Fatalf("read indexes: %v", err)
	}
	got := map[string]string{}
	for _, spec := range specs {
		var keys []string
		for _, k := range spec.Key {
			keys = append(keys, fmt.Sprintf("%s:%v", k.Key, k.Value))
		}
		got[spec.Name] = strings.Join(keys, ",")
	}
	want := map[string]string{
		"_id_":               "_id:1",
		"outbox_claim":       "status:1,createdAt:1",
		"outbox_claim_retry": "status:1,retryAt:1,createdAt:1",
		"outbox_claim_lane":  "status:1,parked:1,retryAt:1,partition:1,createdAt:1,_id:1",
		"outbox_claim_order": "status:1,retryAt:1,createdAt:1,_id:1",
		"outbox_stale":       "status:1,processingAt:1",
		"outbox_retention":   "status:1,publishedAt:1",
		"outbox_sequence":    "status:1,aggregateId:1,sequence:1",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("indexes after three Prepares (-want +got):\n%s", diff)
	}

	want2 := false
	if !testenv.IsFerretDB() {
		// A real server: transactions exactly when it is a replica set
		// member or a mongos.
		var hello struct {
			SetName string `bson:"setName"`
			Msg     string `bson:"msg"`
		}
		if err := db.Client().Database("admin").RunCommand(t.Context(), bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
			t.Fatalf("hello: %v", err)
		}
		want2 = hello.SetName != "" || hello.Msg == "isdbgrid"
	}
	if got := s.SupportsTransactions(); got != want2 {
		t.Errorf("SupportsTransactions = %t, want %t (FerretDB: %t)", got, want2, testenv.IsFerretDB())
	}
	if err := s.Ping(t.Context()); err != nil {
		t.Errorf("Ping: %v", err)
	}
}

// eachClaimStrategy runs test, in parallel, on a store of its own that
// claims with each of the claim's find strategies: the split finds MongoDB
// uses and the single find FerretDB uses must claim the same events.
func eachClaimStrategy(t *testing.T, test func(t *testing.T, s *mongo.Store, coll *driver.Collection)) {
	t.Helper()
	eachStrategy(t, "split", mongo.SetSplitClaim, test)
}

// eachStatsStrategy runs test on a store that counts by index (MongoDB)
// and on one that counts in one read of the backlog (FerretDB).
func eachStatsStrategy(t *testing.T, test func(t *testing.T, s *mongo.Store, coll *driver.Collection)) {
	t.Helper()
	eachStrategy(t, "onePass", mongo.SetOnePassStats, test)
}

// eachStrategy runs test, in parallel, on a store of its own with set
// false, then true.
func eachStrategy(t *testing.T, name string, set func(*mongo.Store, bool), test func(t *testing.T, s *mongo.Store, coll *driver.Collection)) {
	t.Helper()
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("%s=%t", name, on), func(t *testing.T) {
			t.Parallel()
			s, coll := setup(t)
			set(s, on)
			test(t, s, coll)
		})
	}
}
