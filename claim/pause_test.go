package claim

// Paused event types against the real store and broker: the relay
// publishes none of a paused type's events, which with ordering hold their
// aggregates while the rest flows, and publishes them in order once the
// type is resumed.

import (
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
)

// pausedPlan is the outbox of the pause tests, in createdAt order; the
// paused type is "order.paid".
var pausedPlan = []struct {
	id, typ, aggregate string
}{
	{"a0", "order.created", "a"},
	{"b0", "order.created", "b"},
	{"a1", "order.paid", "a"},
	{"c0", "order.paid", "c"},
	{"b1", "order.created", "b"},
	{"a2", "order.created", "a"},
	{"u0", "order.paid", ""},
	{"c1", "order.created", "c"},
	{"b2", "order.created", "b"},
	{"a3", "order.shipped", "a"},
}

// TestPausedTypeRelay: with order.paid paused, a claimer publishes
// neither its events nor, with ordering, the later events of their
// aggregates; the other aggregates and unordered events flow. The paused
// and held events stay NEW with no attempt counted. Resumed, everything
// is published, each aggregate in order.
func TestPausedTypeRelay(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ordering string
		flowing  []string // published while paused
	}{
		{OrderingAggregate, []string{"a0", "b0", "b1", "b2"}},
		{OrderingNone, []string{"a0", "b0", "b1", "a2", "c1", "b2", "a3"}},
	} {
		t.Run(tc.ordering, func(t *testing.T) {
			t.Parallel()
			r := setup(t)
			in := startInbox(t, r.deliveries)
			start := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
			var docs []any
			var want []ordered
			seqs := map[string]int{}
			for i, e := range pausedPlan {
				d := events.Draft{ID: e.id, Type: e.typ, AggregateType: "order", AggregateID: e.aggregate, Payload: bson.D{{Key: "n", Value: i}}}
				if e.aggregate == "" {
					d.AggregateType = ""
				}
				doc, err := d.Document(start.Add(time.Duration(i) * time.Millisecond))
				if err != nil {
					t.Fatal(err)
				}
				docs = append(docs, doc)
				want = append(want, ordered{id: e.id, aggregate: e.aggregate, seq: seqs[e.aggregate]})
				seqs[e.aggregate]++
			}
			if _, err := r.coll.InsertMany(t.Context(), docs); err != nil {
				t.Fatal(err)
			}
			if ok, err := r.store.Pause(t.Context(), events.Pause{Type: "order.paid", By: "ana", Reason: "billing is down", At: time.Now()}); err != nil || !ok {
				t.Fatalf("Pause = %t, %v", ok, err)
			}
			c, _ := newClaimer(t, r.store, newPublisher(t, r.exchange), Config{Ordering: tc.ordering, BatchSize: 3})
			drain := func() {
				t.Helper()
				for i := 0; runOnce(t, c); i++ {
					if i > 20 {
						t.Fatal("the claimer kept reporting more after 20 runs")
					}
				}
			}
			drain()
			in.waitDistinct(t, len(tc.flowing))
			all := allEvents(t, r.coll)
			for _, e := range pausedPlan {
				got, published := all[e.id], slices.Contains(tc.flowing, e.id)
				switch {
				case published && got.Status != events.StatusPublished:
					t.Errorf("%s (%s) is %s while order.paid is paused, want PUBLISHED", e.id, e.typ, got.Status)
				case !published && (got.Status != events.StatusNew || got.Attempts != 0):
					t.Errorf("%s (%s) is %s with %d attempts while order.paid is paused, want NEW with none", e.id, e.typ, got.Status, got.Attempts)
				}
			}
			if tc.ordering == OrderingAggregate {
				held, err := r.store.Held(t.Context(), time.Now(), true)
				if err != nil {
					t.Fatal(err)
				}
				if held.Aggregates != 2 {
					t.Errorf("held aggregates while order.paid is paused: %d, want 2 (a and c)", held.Aggregates)
				}
			}

			if ok, err := r.store.Resume(t.Context(), "order.paid"); err != nil || !ok {
				t.Fatalf("Resume = %t, %v", ok, err)
			}
			drain()
			in.waitDistinct(t, len(pausedPlan))
			if tc.ordering == OrderingAggregate {
				in.checkOrder(t, want, true) // a1 before a2, c0 before c1
			}
			for id, n := range in.Counts() {
				if n != 1 {
					t.Errorf("%s delivered %d times, want once", id, n)
				}
			}
		})
	}
}
