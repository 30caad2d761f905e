package claim

// Per-aggregate order and work sharing against the real store and broker:
// several in-process claimers, each with its own publisher and its own
// ownership manager, on one outbox.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/fakeclock"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/ownership"
)

// ordered is one event the ordering tests insert.
type ordered struct {
	id        string
	aggregate string // "" for an unordered event
	seq       int    // its place in its aggregate
}

// insertInterleaved inserts n events spread round-robin over aggregates
// (aggregate "agg-<k>", type "order"), two events to a millisecond so that
// the _id tiebreak matters, plus every fifth event without an aggregate.
// It returns them in insert order.
func insertInterleaved(t *testing.T, coll *driver.Collection, n, aggregates int) []ordered {
	t.Helper()
	start := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	out := make([]ordered, 0, n)
	docs := make([]any, 0, n)
	seqs := map[string]int{}
	for i := range n {
		id := bson.NewObjectID() // increasing: the tiebreak follows insert order
		d := events.Draft{ID: id, Type: "order.changed", Payload: bson.D{{Key: "n", Value: i}}}
		e := ordered{id: id.Hex()}
		if i%5 != 4 {
			e.aggregate = fmt.Sprintf("agg-%d", i%aggregates)
			d.AggregateType, d.AggregateID = "order", e.aggregate
			e.seq = seqs[e.aggregate]
			seqs[e.aggregate]++
		}
		doc, err := d.Document(start.Add(time.Duration(i/2) * time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
		docs = append(docs, doc)
	}
	if _, err := coll.InsertMany(t.Context(), docs); err != nil {
		t.Fatalf("insert %d events: %v", n, err)
	}
	return out
}

// relayInterleaved returns a test bundle whose outbox holds n events
// interleaved over aggregates (see insertInterleaved), and an inbox on its
// queue.
func relayInterleaved(t *testing.T, n, aggregates int) (testBundle, *inbox, []ordered) {
	t.Helper()
	r := setup(t)
	return r, startInbox(t, r.deliveries), insertInterleaved(t, r.coll, n, aggregates)
}

// checkOrder fails for every event whose first delivery came before the
// first delivery of an earlier event of its aggregate, for every missing
// event, and for every duplicate when noDuplicates.
func (in *inbox) checkOrder(t *testing.T, want []ordered, noDuplicates bool) {
	t.Helper()
	first, counts := in.FirstPositions(), in.Counts()
	last := map[string]ordered{} // per aggregate, the previous event checked
	inversions := 0
	for _, e := range want {
		pos, ok := first[e.id]
		if !ok {
			t.Errorf("event %s (aggregate %q, #%d) never delivered", e.id, e.aggregate, e.seq)
			continue
		}
		if noDuplicates && counts[e.id] > 1 {
			t.Errorf("event %s delivered %d times", e.id, counts[e.id])
		}
		if e.aggregate == "" {
			continue
		}
		if prev, ok := last[e.aggregate]; ok && first[prev.id] > pos {
			inversions++
			if inversions <= 5 {
				t.Errorf("aggregate %s: event #%d delivered before event #%d", e.aggregate, e.seq, prev.seq)
			}
		}
		last[e.aggregate] = e
	}
	if inversions > 0 {
		t.Errorf("%d inversions in all", inversions)
	}
}

// TestOrderedThreeClaimersInterleaved relays interleaved aggregates with
// three claimers running at once, each on its own publisher and its share
// of the partitions: every aggregate arrives in order, and no event is
// delivered twice (only the owner of a partition claims in it, so the
// guarded update has no racer, even on FerretDB).
func TestOrderedThreeClaimersInterleaved(t *testing.T) {
	t.Parallel()
	r, in, want := relayInterleaved(t, 300, 30)

	clock := fakeclock.New(time.Now())
	var owners []*ownership.Manager
	var claimers []*Claimer
	for _, id := range []string{"worker-a", "worker-b", "worker-c"} {
		o := newOwner(t, r.store, clock, id)
		owners = append(owners, o)
		c, _ := newClaimer(t, r.store, newPublisher(t, r.exchange), Config{WorkerID: id, BatchSize: 50, Owner: o})
		claimers = append(claimers, c)
	}
	settleOwnership(t, clock, owners...)
	for _, o := range owners {
		if n := len(o.Owned()); n < 20 || n > 22 {
			t.Errorf("a claimer owns %d partitions, want 20 to 22", n)
		}
	}

	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	var done atomic.Bool
	defer func() { cancel(); wg.Wait() }() // no runOnce outlives a failed wait
	for _, c := range claimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done.Load() && ctx.Err() == nil {
				if _, err := c.runOnce(ctx); err != nil && ctx.Err() == nil {
					t.Errorf("runOnce: %v", err)
					return
				}
			}
		}()
	}
	in.waitDistinct(t, len(want))
	// Each claimer finishes the run it is in: a batch whose confirms
	// were cut off by a cancel would go back to NEW, as it should, and
	// the check below is of a relay that finished, not of a shutdown.
	done.Store(true)
	wg.Wait()
	in.checkOrder(t, want, true)
	for id, e := range allEvents(t, r.coll) {
		if e.Status != events.StatusPublished || e.Attempts != 1 {
			t.Errorf("event %s: %s after %d attempts, want PUBLISHED after 1", id, e.Status, e.Attempts)
		}
	}
}

// headOf returns the id of aggregate's first event in want.
func headOf(t *testing.T, want []ordered, aggregate string) string {
	t.Helper()
	for _, e := range want {
		if e.aggregate == aggregate && e.seq == 0 {
			return e.id
		}
	}
	t.Fatalf("no event of aggregate %s", aggregate)
	return ""
}

// returnFirst returns a publisher on exchange whose first publish of event
// id comes back unroutable; it sends everything else.
func returnFirst(t *testing.T, exchange, id string) *faultPublisher {
	t.Helper()
	var returned atomic.Bool
	return &faultPublisher{Publisher: newPublisher(t, exchange), fail: func(m events.Message) error {
		if m.ID == id && returned.CompareAndSwap(false, true) {
			return fmt.Errorf("%w: NO_ROUTE", events.ErrReturned)
		}
		return nil
	}}
}

// TestOrderedReturnHoldsSuccessors: the first event of an aggregate is
// returned; its successors in the same batch are not published and go
// back to NEW with their attempt refunded, later batches leave them while
// it backs off, other aggregates flow, and once it is due the aggregate
// is delivered in order.
func TestOrderedReturnHoldsSuccessors(t *testing.T) {
	t.Parallel()
	r, in, want := relayInterleaved(t, 40, 4)
	first := headOf(t, want, "agg-0")
	pub := returnFirst(t, r.exchange, first)
	c, _ := newClaimer(t, r.store, pub, Config{BatchSize: 500, RetryMin: time.Minute, RetryMax: time.Hour})

	runOnce(t, c)
	all := allEvents(t, r.coll)
	for _, e := range want {
		got := all[e.id]
		switch {
		case e.id == first:
			if got.Status != events.StatusNew || got.Attempts != 1 || got.RetryAt.IsZero() {
				t.Errorf("returned event: %s, %d attempts, retryAt %s; want NEW backing off after 1 attempt", got.Status, got.Attempts, got.RetryAt)
			}
		case e.aggregate == "agg-0":
			if got.Status != events.StatusNew || got.Attempts != 0 || !got.RetryAt.IsZero() {
				t.Errorf("agg-0 #%d: %s, %d attempts, retryAt %s; want NEW, attempt refunded, no retry time", e.seq, got.Status, got.Attempts, got.RetryAt)
			}
		default:
			if got.Status != events.StatusPublished {
				t.Errorf("event %s of %q: %s, want PUBLISHED", e.id, e.aggregate, got.Status)
			}
		}
	}

	// While the first backs off, later claims leave agg-0 alone, one
	// event at a time as well as in a batch.
	c.cfg.BatchSize = 1
	for range 3 {
		runOnce(t, c)
	}
	for _, e := range want {
		if e.aggregate == "agg-0" && allEvents(t, r.coll)[e.id].Status != events.StatusNew {
			t.Fatalf("agg-0 #%d claimed while #0 backs off", e.seq)
		}
	}

	// Due: the aggregate goes, in order.
	c.cfg.BatchSize = 500
	c.now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	runOnce(t, c)
	in.waitDistinct(t, len(want))
	in.checkOrder(t, want, true)
}

// TestOrderedFailedHoldsUntilRequeueOrSkip: a FAILED event holds the
// later events of its aggregate (policy wait) while others flow, until an
// operator skips it; a requeued one is published first; with policy
// continue they flow past it.
func TestOrderedFailedHoldsUntilRequeueOrSkip(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		afterFailed string
		unblock     func(t *testing.T, s *mongo.Store, id string)
	}{
		{"skip", AfterFailedWait, func(t *testing.T, s *mongo.Store, id string) {
			if n, err := s.Skip(t.Context(), []string{id}, "alice", "bad payload, compensated by hand", time.Now(), false); err != nil || n != 1 {
				t.Fatalf("Skip = %d, %v; want 1", n, err)
			}
		}},
		{"requeue", AfterFailedWait, func(t *testing.T, s *mongo.Store, id string) {
			if n, err := s.Requeue(t.Context(), mongo.RequeueFilter{IDs: []string{id}}, false); err != nil || n != 1 {
				t.Fatalf("Requeue = %d, %v; want 1", n, err)
			}
		}},
		{"continue", AfterFailedContinue, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, in, want := relayInterleaved(t, 20, 2)
			failed := headOf(t, want, "agg-0")
			if _, err := r.coll.UpdateOne(t.Context(), bson.D{{Key: events.FieldID, Value: oid(t, failed)}},
				bson.D{{Key: "$set", Value: bson.D{{Key: events.FieldStatus, Value: events.StatusFailed}, {Key: events.FieldLastError, Value: "gave up"}}}}); err != nil {
				t.Fatal(err)
			}
			c, _ := newClaimer(t, r.store, newPublisher(t, r.exchange), Config{AfterFailed: tc.afterFailed})
			runOnce(t, c)
			held, err := r.store.Held(t.Context(), time.Now(), tc.afterFailed == AfterFailedWait)
			if err != nil {
				t.Fatal(err)
			}
			all := allEvents(t, r.coll)
			for _, e := range want {
				if e.id == failed {
					continue
				}
				wantStatus := events.StatusPublished
				if e.aggregate == "agg-0" && tc.afterFailed == AfterFailedWait {
					wantStatus = events.StatusNew
				}
				if got := all[e.id].Status; got != wantStatus {
					t.Errorf("event %q #%d: %s, want %s", e.aggregate, e.seq, got, wantStatus)
				}
			}
			if tc.unblock == nil {
				if held.Aggregates != 0 {
					t.Errorf("held aggregates = %d under continue, want 0", held.Aggregates)
				}
				return
			}
			if held.Aggregates != 1 || held.OldestWaiting.IsZero() {
				t.Errorf("Held = %+v, want 1 aggregate with an oldest event", held)
			}
			tc.unblock(t, r.store, failed)
			runOnce(t, c)
			for id, e := range allEvents(t, r.coll) {
				if id != failed && e.Status != events.StatusPublished {
					t.Errorf("event %s after %s: %s, want PUBLISHED", id, tc.name, e.Status)
				}
			}
			if tc.name == "requeue" {
				in.waitDistinct(t, len(want))
				in.checkOrder(t, want, true)
			}
		})
	}
}

// TestOrderedHotAggregate: one aggregate's events, a batch of them at a
// time, go out in order, one round per event.
func TestOrderedHotAggregate(t *testing.T) {
	t.Parallel()
	r := setup(t)
	in := startInbox(t, r.deliveries)
	const n = 1000 // the 10,000 of the container suite, scaled down for FerretDB
	start := time.Now().Add(-time.Hour)
	want := make([]ordered, n)
	docs := make([]any, n)
	for i := range n {
		id := bson.NewObjectID()
		doc, err := events.Draft{ID: id, Type: "account.moved", AggregateType: "account", AggregateID: "hot",
			Payload: bson.D{{Key: "n", Value: i}}}.Document(start.Add(time.Duration(i/3) * time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		want[i], docs[i] = ordered{id: id.Hex(), aggregate: "hot", seq: i}, doc
	}
	if _, err := r.coll.InsertMany(t.Context(), docs); err != nil {
		t.Fatal(err)
	}
	c, _ := newClaimer(t, r.store, newPublisher(t, r.exchange), Config{BatchSize: 500})
	for range 4 {
		if !runOnce(t, c) {
			break
		}
	}
	in.waitDistinct(t, n)
	in.checkOrder(t, want, true)
}

// TestOrderingNone: without ordering a returned event holds nothing back:
// its successors in the batch are published, and so are later events of
// its aggregate while it backs off.
func TestOrderingNone(t *testing.T) {
	t.Parallel()
	r, in, want := relayInterleaved(t, 12, 2)
	first := headOf(t, want, "agg-0")
	pub := returnFirst(t, r.exchange, first)
	c, _ := newClaimer(t, r.store, pub, Config{Ordering: OrderingNone, RetryMin: time.Minute, RetryMax: time.Hour})
	runOnce(t, c)
	in.waitDistinct(t, len(want)-1)
	for id, e := range allEvents(t, r.coll) {
		wantStatus := events.StatusPublished
		if id == first {
			wantStatus = events.StatusNew
		}
		if e.Status != wantStatus {
			t.Errorf("event %s: %s, want %s", id, e.Status, wantStatus)
		}
	}
}
