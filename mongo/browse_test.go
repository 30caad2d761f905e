package mongo_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

// TestListEventsPagesNewestFirst: pages of one status come newest first,
// events created in the same millisecond in _id order, and following the
// marks lists every event once, across the ties at page boundaries.
func TestListEventsPagesNewestFirst(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	if err := s.EnsureBrowseIndex(t.Context()); err != nil {
		t.Fatalf("EnsureBrowseIndex: %v", err)
	}
	var docs []bson.D
	var want []string
	for i := range 23 {
		// Three events share each millisecond.
		at := ago(time.Duration(i/3) * time.Second)
		id := fmt.Sprintf("e%02d", i)
		docs = append(docs, ev(id, events.StatusFailed, at))
	}
	docs = append(docs, ev("new", events.StatusNew, base))
	insert(t, coll, docs...)
	// Newest first: event i is i/3 seconds old; within a millisecond,
	// _id descending.
	for sec := 0; 3*sec < 23; sec++ {
		for i := min(3*sec+2, 22); i >= 3*sec; i-- {
			want = append(want, fmt.Sprintf("e%02d", i))
		}
	}

	var got []string
	var mark *mongo.PageMark
	for page := 0; page < 10; page++ {
		rows, next, err := s.ListEvents(t.Context(), mongo.EventQuery{Status: events.StatusFailed, After: mark, Limit: 5})
		if err != nil {
			t.Fatalf("ListEvents page %d: %v", page, err)
		}
		for _, r := range rows {
			id, _ := r.Lookup(events.FieldID).StringValueOK()
			got = append(got, id)
		}
		if next == nil {
			break
		}
		mark = next
	}
	if !slices.Equal(got, want) {
		t.Errorf("pages listed\n%v\nwant\n%v", got, want)
	}
}

// TestListEventsFilters: type, aggregate, error text, failure group and
// age each narrow the list.
func TestListEventsFilters(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	insert(t, coll,
		withType(ev("a", events.StatusFailed, ago(time.Hour), field(events.FieldAggregateID, "o-1"), field(events.FieldLastError, "Broker NACKED it")), "order.paid"),
		ev("b", events.StatusFailed, ago(time.Minute), field(events.FieldAggregateID, "o-2"), field(events.FieldLastError, `returned 312 NO_ROUTE for "x"`)),
		ev("c", events.StatusFailed, ago(time.Second), field(events.FieldLastError, "returned 312 NO_ROUTE for x"),
			field(events.FieldFailureCause, `returned <n> NO_ROUTE for .*`), field(events.FieldFailureReason, "returned")),
		ev("d", events.StatusFailed, ago(time.Second), field(events.FieldLastError, "returned 312 NO_ROUTE for x"),
			field(events.FieldFailureCause, `returned <n> NO_ROUTE for .*`), field(events.FieldFailureReason, "returned"),
			field(events.FieldSkippedAt, ago(time.Second))),
	)
	for _, tt := range []struct {
		name string
		q    mongo.EventQuery
		want []string
	}{
		{"type", mongo.EventQuery{Type: "order.paid"}, []string{"a"}},
		{"aggregate", mongo.EventQuery{AggregateID: "o-2"}, []string{"b"}},
		{"error text, any case, taken literally", mongo.EventQuery{ErrorText: "broker nacked"}, []string{"a"}},
		{"error text with regex characters", mongo.EventQuery{ErrorText: `for "x"`}, []string{"b"}},
		{"group: its cause as text, not skipped", mongo.EventQuery{Group: &mongo.Group{Cause: `returned <n> NO_ROUTE for .*`, Reason: "returned"}}, []string{"c"}},
		{"group of another reason", mongo.EventQuery{Group: &mongo.Group{Cause: `returned <n> NO_ROUTE for .*`}}, nil},
		{"older than", mongo.EventQuery{CreatedBefore: ago(30 * time.Second)}, []string{"b", "a"}},
	} {
		tt.q.Status, tt.q.Limit = events.StatusFailed, 10
		rows, next, err := s.ListEvents(t.Context(), tt.q)
		if err != nil || next != nil {
			t.Fatalf("%s: ListEvents = %v, next %v", tt.name, err, next)
		}
		var got []string
		for _, r := range rows {
			id, _ := r.Lookup(events.FieldID).StringValueOK()
			got = append(got, id)
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestConsoleReads: the failed sample keeps the last attempt only, the
// holders are the FAILED and backing-off events of their aggregates, and
// the publish counts fall in their minutes.
func TestConsoleReads(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	history := bson.A{
		bson.D{{Key: "at", Value: ago(time.Hour)}, {Key: "workerId", Value: "w"}, {Key: "reason", Value: "nacked"}, {Key: "error", Value: "one"}},
		bson.D{{Key: "at", Value: ago(time.Minute)}, {Key: "workerId", Value: "w"}, {Key: "reason", Value: "max_attempts"}, {Key: "error", Value: "two"}},
	}
	insert(t, coll,
		ev("failed", events.StatusFailed, ago(time.Hour), append(agg("a"), field(events.FieldAttemptErrors, history))...),
		ev("waiting", events.StatusNew, ago(time.Minute), agg("a")...),
		ev("backing-off", events.StatusNew, ago(time.Hour), append(agg("b"), field(events.FieldRetryAt, base.Add(time.Hour)))...),
		ev("p1", events.StatusPublished, ago(time.Hour), field(events.FieldPublishedAt, base.Add(-90*time.Second))),
		ev("p2", events.StatusPublished, ago(time.Hour), field(events.FieldPublishedAt, base.Add(-80*time.Second))),
		ev("p3", events.StatusPublished, ago(time.Hour), field(events.FieldPublishedAt, base.Add(-2*time.Hour))),
	)

	docs, more, err := s.FailedSample(t.Context(), 10)
	if err != nil || more || len(docs) != 1 {
		t.Fatalf("FailedSample = %d docs, more %t, %v; want 1", len(docs), more, err)
	}
	arr, _ := docs[0].Lookup(events.FieldAttemptErrors).ArrayOK()
	// The last attempt last: on FerretDB the whole history comes.
	if vals, _ := arr.Values(); len(vals) == 0 || vals[len(vals)-1].Document().Lookup("reason").StringValue() != "max_attempts" {
		t.Errorf("FailedSample's history = %v, want the last attempt last", arr)
	}

	holders, more, err := s.Holders(t.Context(), base, true, 10)
	if err != nil || more {
		t.Fatalf("Holders: %v, more %t", err, more)
	}
	var got []string
	for _, h := range holders {
		id, _ := h.Doc.Lookup(events.FieldID).StringValueOK()
		agg, _ := h.Doc.Lookup(events.FieldAggregateID).StringValueOK()
		got = append(got, agg+" "+id)
	}
	if want := []string{"a failed", "b backing-off"}; !slices.Equal(got, want) {
		t.Errorf("Holders = %v, want %v", got, want)
	}

	counts, err := s.PublishedPerMinute(t.Context(), base.Add(-5*time.Minute), base)
	if err != nil {
		t.Fatalf("PublishedPerMinute: %v", err)
	}
	if want := []int64{0, 0, 0, 2, 0, 0}; !slices.Equal(counts, want) {
		t.Errorf("PublishedPerMinute = %v, want %v", counts, want)
	}
}
