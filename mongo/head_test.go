package mongo_test

import (
	"context"
	"fmt"
	"log/slog"
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

// An ordered claim first probes the head, so that an idle outbox costs
// one find; while a backlog drains (ClaimLimit.Draining) it leaves the
// probe out, and claims the same events with one find less.
func TestClaimDrainingSkipsProbe(t *testing.T) {
	t.Parallel()
	s, sent := countingStore(t)
	// The paused types are read by the first claim only: a claim of its
	// own, so that the two compared read them alike.
	mongo.SetPausedMaxAge(s, time.Hour)
	at := ago(time.Hour)
	for i := range 6 {
		insert(t, s.Collection(), ev(fmt.Sprintf("e%d", i), events.StatusNew, at.Add(time.Duration(i)*time.Millisecond), agg(fmt.Sprintf("a%d", i))...))
	}

	claim := func(draining bool) (claimed []any, findsSent int) {
		t.Helper()
		before := sent("find")
		res, err := s.Claim(t.Context(), events.Lease{WorkerID: "w", Token: fmt.Sprint("t", draining), At: base},
			events.ClaimLimit{Events: 2, Ordered: true, FailedHolds: true, Draining: draining})
		if err != nil {
			t.Fatalf("Claim(draining %t): %v", draining, err)
		}
		return mongotest.IDs(res.Claimed), sent("find") - before
	}
	claim(true)
	mongo.DropReadAhead(s) // each claim reads the lane (see TestReadAheadFeedsTheNextClaims)
	first, probing := claim(false)
	mongo.DropReadAhead(s)
	second, draining := claim(true)
	if len(first) != 2 || len(second) != 2 {
		t.Fatalf("claimed %v, then %v: want two events each", first, second)
	}
	if draining != probing-1 {
		t.Errorf("finds of a claim: %d probing, %d draining; want one less while draining", probing, draining)
	}
}

// Events backing off at the head do not hide what is due behind them: on
// FerretDB an ordered claim reads them with the head, and where they fill
// the whole window it reads again as on MongoDB, past them. The later
// events of a key backing off wait.
func TestClaimPastEventsBackingOff(t *testing.T) {
	t.Parallel()
	eachClaimStrategy(t, func(t *testing.T, s *mongo.Store, coll *driver.Collection) {
		at := ago(time.Hour)
		var docs []bson.D
		for i := range 300 { // more than the window of a 2-event claim (200)
			docs = append(docs, ev(fmt.Sprintf("b%03d", i), events.StatusNew, at.Add(time.Duration(i)*time.Millisecond),
				append(agg(fmt.Sprintf("b%03d", i)), field(events.FieldRetryAt, base.Add(time.Hour)), field(events.FieldAttempts, 1))...))
		}
		later := at.Add(time.Second)
		docs = append(docs,
			ev("late", events.StatusNew, later, agg("b007")...), // waits behind b007's retry
			ev("due", events.StatusNew, later.Add(time.Millisecond), agg("other")...),
		)
		insert(t, coll, docs...)
		res, err := s.Claim(t.Context(), events.Lease{WorkerID: "w", Token: "t", At: base},
			events.ClaimLimit{Events: 2, Ordered: true, FailedHolds: true, Draining: true})
		if err != nil {
			t.Fatalf("Claim: %v", err)
		}
		if got := ids(res.Claimed); !slices.Equal(got, []string{"due"}) {
			t.Errorf("claimed %v, want [due]: late waits behind b007's retry, the rest back off", got)
		}
	})
}

// countingStore returns a prepared store on a database of its own whose
// client counts the commands it sends, and a function that tells how many
// of one name it has sent.
func countingStore(t *testing.T) (*mongo.Store, func(command string) int) {
	t.Helper()
	var mu sync.Mutex
	counts := map[string]int{}
	monitor := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		mu.Lock()
		counts[e.CommandName]++
		mu.Unlock()
	}}
	return monitoredStore(t, monitor), func(command string) int {
		mu.Lock()
		defer mu.Unlock()
		return counts[command]
	}
}

// monitoredStore returns a prepared store on a database of its own whose
// client reports its commands to monitor.
func monitoredStore(t *testing.T, monitor *event.CommandMonitor) *mongo.Store {
	t.Helper()
	client, err := driver.Connect(options.Client().ApplyURI(testenv.MongoURI(t)).SetMonitor(monitor))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	db := client.Database(testenv.UniqueName(t, "t_"))
	t.Cleanup(func() { _ = db.Drop(context.Background()) })
	s := mongo.New(client, mongo.Config{Database: db.Name(), Logger: slog.New(slog.DiscardHandler)})
	if err := s.Prepare(t.Context()); err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	return s
}

// Every replica prepares the collection at each start: once the indexes
// exist, that lists them and creates none.
func TestPrepareAgainCreatesNoIndex(t *testing.T) {
	t.Parallel()
	s, sent := countingStore(t)
	created := sent("createIndexes")
	if created == 0 {
		t.Fatal("the first Prepare created no index")
	}
	if err := s.Prepare(t.Context()); err != nil {
		t.Fatalf("Prepare again: %v", err)
	}
	if got := sent("createIndexes") - created; got != 0 {
		t.Errorf("Prepare with every index in place sent %d createIndexes, want 0", got)
	}
}

// After a claim's find is cut off by its deadline, the next claim reads
// one document per reply (a reply of many large documents is what takes
// FerretDB that long), and the claim after a success reads whole batches
// again.
func TestClaimAfterTimeoutReadsOneDocumentPerReply(t *testing.T) {
	t.Parallel()
	s, sent := countingStore(t)
	at := ago(time.Hour)
	for i := range 12 {
		insert(t, s.Collection(), ev(fmt.Sprintf("e%02d", i), events.StatusNew, at.Add(time.Duration(i)*time.Millisecond)))
	}
	limit := events.ClaimLimit{Events: 4}
	expired, cancel := context.WithTimeout(t.Context(), -time.Second)
	defer cancel()
	if _, err := s.Claim(expired, events.Lease{WorkerID: "w", Token: "t0", At: base}, limit); err == nil {
		t.Fatal("Claim under an expired deadline succeeded")
	}
	for i, want := range []struct {
		getMores int
		what     string
	}{{3, "one document per reply after the timeout"}, {0, "whole batches after a success"}} {
		before := sent("getMore")
		res, err := s.Claim(t.Context(), events.Lease{WorkerID: "w", Token: fmt.Sprint("t", i+1), At: base}, limit)
		if err != nil || len(res.Claimed) != 4 {
			t.Fatalf("claim %d = %d events, %v; want 4", i+1, len(res.Claimed), err)
		}
		if got := sent("getMore") - before; got != want.getMores {
			t.Errorf("claim %d sent %d getMores, want %d: %s", i+1, got, want.getMores, want.what)
		}
	}
}
