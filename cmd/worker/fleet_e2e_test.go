package main

// The fleet scenario: worker processes that each relay several outboxes
// from one fleet file, two of them in one database and one in another,
// with a replica killed in the middle.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/internal/workerproc"
)

// envE2EFleetEvents sets the events of each outbox of the fleet scenario.
const envE2EFleetEvents = "OUTBOX_E2E_FLEET_EVENTS"

// fleetAggregates is how many aggregates each outbox's events belong to:
// few enough that each has dozens of events whose order can be checked.
const fleetAggregates = 40

// fleetOutbox is one outbox of the scenario: where it is, the events
// inserted into it, and the consumer of its exchange.
type fleetOutbox struct {
	name, collection, exchange string
	db                         *driver.Database
	coll                       *driver.Collection
	ids                        []string
	// fields are more fields of its entry in the fleet file.
	fields map[string]string
	// byAggregate lists each aggregate's ids in createdAt order.
	byAggregate map[string][]string
	r           *orderReceiver
}

// fleetOf gives each outbox its collection, an exchange of its own and
// a consumer of it, and writes the fleet file that lists them; it
// returns the file's path.
func fleetOf(t *testing.T, s stack, outboxes []*fleetOutbox) string {
	t.Helper()
	var file strings.Builder
	file.WriteString("outboxes:\n")
	for _, o := range outboxes {
		o.coll = o.db.Collection(o.collection)
		o.exchange = testenv.UniqueName(t, "ex_"+o.name+"_")
		o.r = consumeOrdered(t, s, o.exchange, "#")
		fmt.Fprintf(&file, "  - name: %s\n    database: %s\n    collection: %s\n    exchange: %s\n", o.name, o.db.Name(), o.collection, o.exchange)
		for _, k := range slices.Sorted(maps.Keys(o.fields)) {
			fmt.Fprintf(&file, "    %s: %s\n", k, o.fields[k])
		}
	}
	return writeFleet(t, file.String())
}

// startFleet starts replicas worker processes that relay the fleet file
// at path, with more set over workerEnv's settings, and returns them
// with their worker ids (named after the database db).
func startFleet(t *testing.T, s stack, path, db string, replicas int, more map[string]string) ([]*workerproc.Proc, []string) {
	t.Helper()
	procs := make([]*workerproc.Proc, replicas)
	ids := make([]string, replicas)
	for i := range procs {
		ids[i] = fmt.Sprintf("%s-w%d", db, i)
		env := s.workerEnv(db, "unused", ids[i])
		env["OUTBOX_FLEET_FILE"] = path
		maps.Copy(env, more)
		procs[i] = startWorker(t, ids[i], env)
	}
	return procs, ids
}

// TestE2EFleet: three replicas relay three outboxes (two in one database,
// one in another) from one fleet file. One replica is killed holding
// claims; every event of every outbox arrives on its own exchange and no
// other, the events of each aggregate first arrive in order, and each
// outbox's stranded events are claimed again by a survivor.
func TestE2EFleet(t *testing.T) {
	t.Parallel()
	s := localStack(t)
	n := envInt(t, envE2EFleetEvents, 1500, 100, 1_000_000)
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout(3*n)+time.Minute)
	defer cancel()

	client := s.connect(t, testenv.ClientMaxPoolSize)
	shared, other := uniqueDatabase(t, client), uniqueDatabase(t, client)
	outboxes := []*fleetOutbox{
		{name: "orders", db: shared, collection: "orders_outbox"},
		{name: "billing", db: shared, collection: "billing_outbox"},
		// Named, as a cluster of its own would be: the same URI shares
		// the client of the others.
		{name: "shipping", db: other, collection: "events", fields: map[string]string{"mongo_uri": s.mongoURI}},
	}
	path := fleetOf(t, s, outboxes)
	base := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	for _, o := range outboxes {
		o.insert(ctx, t, base, n)
	}

	// Small batches, so that each replica claims in every outbox before
	// the backlog is gone.
	procs, workerIDs := startFleet(t, s, path, shared.Name(), 3, map[string]string{"OUTBOX_BATCH_SIZE": "100"})
	victim, victimID := procs[0], workerIDs[0]
	first := outboxes[0]
	first.r.waitDistinct(ctx, t, n/5)
	stranded := killHolding(ctx, t, first.coll, first.r.receiver, victim, victimID, n)
	t.Logf("killed %s holding %d events of %s", victimID, len(stranded), first.name)

	for _, o := range outboxes {
		explained(t, o.coll, func() { o.r.waitDistinct(ctx, t, n) })
		waitCount(ctx, t, o.coll, bson.D{{Key: events.FieldStatus, Value: events.StatusPublished}}, int64(n))
	}
	stopWorkers(t, procs[1:]...)
	for _, o := range outboxes {
		o.r.drain(t)
		o.check(t)
		survivors := 0
		for _, p := range procs[1:] {
			if publishedBy(ctx, t, o.coll, p) > 0 {
				survivors++
			}
		}
		if survivors != 2 {
			t.Errorf("outbox %s: %d of the 2 surviving replicas published its events, want both: replicas divide outbox x partition", o.name, survivors)
		}
	}
	for _, id := range stranded {
		var doc struct {
			Status   events.Status `bson:"status"`
			Attempts int           `bson:"attempts"`
		}
		if err := first.coll.FindOne(ctx, bson.D{{Key: events.FieldID, Value: id}}).Decode(&doc); err != nil {
			t.Fatalf("find stranded event %v: %v", id, err)
		}
		if doc.Status != events.StatusPublished || doc.Attempts < 2 {
			t.Errorf("stranded event %v of %s: %s after %d attempts, want PUBLISHED after a second claim", id, first.name, doc.Status, doc.Attempts)
		}
	}
	// Each outbox keeps its partitions' owners beside its own collection:
	// two outboxes of one database do not share them.
	for _, o := range outboxes {
		c, err := o.db.Collection(o.collection+"_owners").CountDocuments(ctx, bson.D{})
		if err != nil || c == 0 {
			t.Errorf("outbox %s: %d documents in %s_owners (error %v), want its own ownership state", o.name, c, o.collection, err)
		}
	}
}

// insert inserts n NEW events into o, spread over fleetAggregates
// aggregates, createdAt a millisecond apart from base, and notes their ids
// per aggregate. The payload names the outbox, and the type carries it, so
// that an event relayed to another outbox's exchange is told apart.
func (o *fleetOutbox) insert(ctx context.Context, t *testing.T, base time.Time, n int) {
	t.Helper()
	o.byAggregate = map[string][]string{}
	docs := make([]any, 0, n)
	for i := range n {
		agg := fmt.Sprintf("%s-%02d", o.name, i%fleetAggregates)
		doc := draftDoc(t, events.Draft{
			Type: "fleet." + o.name, AggregateType: "e2e", AggregateID: agg,
			Payload: bson.D{{Key: "outbox", Value: o.name}, {Key: "n", Value: i}},
		}, base.Add(time.Duration(i)*time.Millisecond))
		id := testenv.MessageID(doc[0].Value)
		o.ids = append(o.ids, id)
		o.byAggregate[agg] = append(o.byAggregate[agg], id)
		docs = append(docs, doc)
	}
	for i := 0; i < len(docs); i += insertChunk {
		if _, err := o.coll.InsertMany(ctx, docs[i:min(i+insertChunk, len(docs))], options.InsertMany().SetOrdered(false)); err != nil {
			t.Fatalf("insert events of %s: %v", o.name, err)
		}
	}
}

// check checks what o's exchange delivered: exactly o's events, and the
// first delivery of each after that of every earlier event of its
// aggregate.
func (o *fleetOutbox) check(t *testing.T) {
	t.Helper()
	o.r.checkExactly(t, o.ids)
	pos := o.r.firstArrivals()
	for agg, ids := range o.byAggregate {
		for i := 1; i < len(ids); i++ {
			if pos[ids[i]] < pos[ids[i-1]] {
				t.Errorf("outbox %s, aggregate %s: event %d (%s) arrived before event %d (%s)", o.name, agg, i, ids[i], i-1, ids[i-1])
				break
			}
		}
	}
	distinct, total, _ := o.r.Snapshot()
	t.Logf("outbox %s: %d events, %d deliveries", o.name, distinct, total)
}

// TestE2EFleetDatabaseDown: a worker of two outboxes on two database
// links, one of them cut. The other relays all its events meanwhile;
// /readyz stays 200 and names the outbox that is not ready, which alone
// answers 503 with ?outbox=; once its link is back, it relays its events
// too.
func TestE2EFleetDatabaseDown(t *testing.T) {
	t.Parallel()
	s := localStack(t)
	const n = 200
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout(2*n)+time.Minute)
	defer cancel()
	client := s.connect(t, testenv.ClientMaxPoolSize)
	downURI, proxy := testenv.Proxied(t, s.mongoURI)
	up := &fleetOutbox{name: "up", db: uniqueDatabase(t, client), collection: "events"}
	down := &fleetOutbox{name: "down", db: uniqueDatabase(t, client), collection: "events", fields: map[string]string{"mongo_uri": downURI}}
	path := fleetOf(t, s, []*fleetOutbox{up, down})
	base := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	up.insert(ctx, t, base, n)
	down.insert(ctx, t, base, n)

	proxy.Cut()
	// The HTTP address is logged at info.
	procs, _ := startFleet(t, s, path, up.db.Name(), 1, map[string]string{"OUTBOX_LOG_LEVEL": "info"})
	p := procs[0]

	up.r.waitDistinct(ctx, t, n)
	testenv.Eventually(t, timeLeft(ctx), func() (bool, string) {
		code, body := workerGet(ctx, t, p, "/readyz")
		var ready struct {
			Ready    bool              `json:"ready"`
			NotReady map[string]string `json:"notReady"`
		}
		_ = json.Unmarshal(body, &ready)
		return code == http.StatusOK && ready.Ready && strings.HasPrefix(ready.NotReady["down"], "mongodb: ") && len(ready.NotReady) == 1,
			fmt.Sprintf("/readyz %d %s, want 200 naming outbox down's database as not ready", code, body)
	})
	if code, body := workerGet(ctx, t, p, "/readyz?outbox=down"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz?outbox=down = %d %s, want 503", code, body)
	}
	if code, body := workerGet(ctx, t, p, "/readyz?outbox=up"); code != http.StatusOK {
		t.Errorf("/readyz?outbox=up = %d %s, want 200", code, body)
	}
	if got := down.r.distinct(); got != 0 {
		t.Errorf("%d events of outbox down arrived while its database was cut, want none", got)
	}

	proxy.Restore()
	down.r.waitDistinct(ctx, t, n)
	stopWorkers(t, p)
	for _, o := range []*fleetOutbox{up, down} {
		o.r.drain(t)
		o.check(t)
	}
}
