package main

// Partition ownership with real concurrency on a real MongoDB: three
// replicas relay interleaved aggregates, one of them stops renewing its
// terms mid-run (a pause) while its claimer keeps trying, and the others
// take over its share. No event may be delivered twice, no aggregate out
// of order, and the paused replica may claim nothing once its deadline has
// passed.

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/broker"
	"github.com/outboxrelay/outbox/claim"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/ownership"
)

// claimSpy records when a replica's claims returned events.
type claimSpy struct {
	claim.Store
	mu   sync.Mutex
	last time.Time // the end of the last claim that returned events
}

func (s *claimSpy) ClaimRead(ctx context.Context, lease events.Lease, docs []bson.Raw, limit events.ClaimLimit) (events.ClaimResult, error) {
	res, err := s.Store.ClaimRead(ctx, lease, docs, limit)
	if len(res.Claimed) > 0 {
		s.mu.Lock()
		s.last = time.Now()
		s.mu.Unlock()
	}
	return res, err
}

func (s *claimSpy) lastClaim() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// TestOwnershipFencing runs the scenario on embedded FerretDB (or the
// MongoDB of OUTBOX_TEST_MONGO_URI): with partitions owned, replicas never
// race, so FerretDB's non-atomic claim delivers nothing twice either.
func TestOwnershipFencing(t *testing.T) {
	t.Parallel()
	s := stack{name: "ferretdb", mongoURI: testenv.MongoURI(t), amqpURL: testenv.AMQPURL(t), atomicClaims: !testenv.IsFerretDB()}
	ownershipFencingScenario(t, s, 600)
}

func ownershipFencingScenario(t *testing.T, s stack, n int) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	client := s.connect(t, testenv.ClientMaxPoolSize)
	db := uniqueDatabase(t, client)
	exchange := testenv.UniqueName(t, "ex_")
	deliveries := testenv.Consume(t, s.amqpURL, exchange)

	const aggregates, term = 100, 2 * time.Second
	start := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	type sent struct {
		id, aggregate string
	}
	want := make([]sent, n)
	docs := make([]any, n)
	for i := range n {
		id := bson.NewObjectID()
		d := events.Draft{ID: id, Type: "order.changed", Payload: bson.D{{Key: "n", Value: i}}}
		if i%7 != 6 {
			d.AggregateType, d.AggregateID = "order", fmt.Sprintf("agg-%d", i%aggregates)
		}
		doc, err := d.Document(start.Add(time.Duration(i/2) * time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		want[i], docs[i] = sent{id: id.Hex(), aggregate: d.AggregateID}, doc
	}
	setup := mongo.New(client, mongo.Config{Database: db.Name()})
	if err := setup.Prepare(ctx); err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	if _, err := setup.Collection().InsertMany(ctx, docs); err != nil {
		t.Fatalf("insert: %v", err)
	}

	var (
		owners   []*ownership.Manager
		claimers []*claim.Claimer
		spies    []*claimSpy
	)
	for _, id := range []string{"replica-a", "replica-b", "replica-c"} {
		store := mongo.New(client, mongo.Config{Database: db.Name()})
		if err := store.Prepare(ctx); err != nil {
			t.Fatalf("Prepare: %v", err)
		}
		pub, err := broker.New(broker.Config{URL: s.amqpURL, Exchange: exchange})
		if err != nil {
			t.Fatal(err)
		}
		if err := pub.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pub.Stop(context.Background()) })
		owner, err := ownership.New(store.Owners(), ownership.Config{WorkerID: id, TermLength: term, Ready: pub.Ready})
		if err != nil {
			t.Fatal(err)
		}
		spy := &claimSpy{Store: store}
		c, err := claim.New(spy, pub, claim.Config{WorkerID: id, Schedule: "@every 20ms", BatchSize: 100,
			PublishTimeout: 5 * time.Second, StaleAfter: 10 * time.Second, Owner: owner})
		if err != nil {
			t.Fatal(err)
		}
		owners, claimers, spies = append(owners, owner), append(claimers, c), append(spies, spy)
	}
	for i := range owners {
		if err := owners[i].Start(ctx); err != nil {
			t.Fatal(err)
		}
		if err := claimers[i].Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for i := range owners {
			_ = claimers[i].Stop(context.Background())
			_ = owners[i].Stop(context.Background())
		}
	})

	first := map[string]int{}
	counts := map[string]int{}
	received := 0
	var paused time.Time
	for len(first) < n {
		select {
		case d := <-deliveries:
			if _, ok := first[d.MessageId]; !ok {
				first[d.MessageId] = received
			}
			counts[d.MessageId]++
			received++
			// A third of the way in, replica c stops renewing: a pause of
			// its ownership loop, while its claimer keeps running.
			if paused.IsZero() && len(first) >= n/3 {
				if err := owners[2].Stop(ctx); err != nil {
					t.Fatal(err)
				}
				paused = time.Now()
			}
		case <-ctx.Done():
			t.Fatalf("received %d of %d events: %v", len(first), n, ctx.Err())
		}
	}
	for id, c := range counts {
		if c > 1 {
			t.Errorf("event %s delivered %d times", id, c)
		}
	}
	last := map[string]string{}
	for _, e := range want {
		if e.aggregate == "" {
			continue
		}
		if prev, ok := last[e.aggregate]; ok && first[prev] > first[e.id] {
			t.Errorf("aggregate %s: %s delivered before the earlier %s", e.aggregate, e.id, prev)
		}
		last[e.aggregate] = e.id
	}
	// c's deadline: at most one term after its last renewal, which came
	// before the pause.
	if lc := spies[2].lastClaim(); lc.After(paused.Add(term)) {
		t.Errorf("replica c claimed events %s after its ownership loop stopped; its terms last %s", lc.Sub(paused), term)
	}
	testenv.Eventually(t, 5*term, func() (bool, string) {
		owned := len(owners[0].Owned()) + len(owners[1].Owned())
		return owned == events.Partitions, fmt.Sprintf("a and b own %d partitions %s after c's pause, want all %d", owned, time.Since(paused), events.Partitions)
	})
}
