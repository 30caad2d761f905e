package mongo_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/mongo/mongotest"
)

// failedWith is a FAILED event whose last attempt gave up for reason
// with lastError.
func failedWith(id, reason, lastError string, extra ...bson.E) bson.D {
	return ev(id, events.StatusFailed, ago(time.Hour), append([]bson.E{
		field(events.FieldLastError, lastError),
		field(events.FieldAttemptErrors, bson.A{
			bson.D{{Key: "at", Value: ago(2 * time.Hour)}, {Key: "reason", Value: "nacked"}, {Key: "error", Value: "first"}},
			bson.D{{Key: "at", Value: ago(time.Hour)}, {Key: "reason", Value: reason}, {Key: "error", Value: lastError}},
		}),
	}, extra...)...)
}

// TestClassifyFailedStoresTheCause: each FAILED event's cause and reason
// are stored once; a requeue clears them.
func TestClassifyFailedStoresTheCause(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	insert(t, coll,
		failedWith("a", "returned", `returned 312 NO_ROUTE for "a"`),
		failedWith("b", "max_attempts", `returned 312 NO_ROUTE for "b"`),
		ev("n", events.StatusNew, ago(time.Hour), field(events.FieldLastError, "x 1")),
	)
	n, err := s.ClassifyFailed(t.Context(), 100)
	if err != nil || n != 2 {
		t.Fatalf("ClassifyFailed = %d, %v; want the 2 FAILED events", n, err)
	}
	if n, err := s.ClassifyFailed(t.Context(), 100); err != nil || n != 0 {
		t.Errorf("a second ClassifyFailed = %d, %v; want none left", n, err)
	}
	for id, want := range map[string][2]string{"a": {"returned", `returned <n> NO_ROUTE for "…"`}, "b": {"max_attempts", `returned <n> NO_ROUTE for "…"`}} {
		var doc struct {
			Cause  string `bson:"failureCause"`
			Reason string `bson:"failureReason"`
		}
		if err := coll.FindOne(t.Context(), bson.D{{Key: "_id", Value: id}}).Decode(&doc); err != nil {
			t.Fatal(err)
		}
		if doc.Reason != want[0] || doc.Cause != want[1] {
			t.Errorf("%s: reason %q cause %q, want %q %q", id, doc.Reason, doc.Cause, want[0], want[1])
		}
	}
	if has(t, coll, "n", events.FieldFailureCause) {
		t.Error("a NEW event was classified")
	}
	if _, err := s.Requeue(t.Context(), mongo.RequeueFilter{IDs: []string{"a"}}, false); err != nil {
		t.Fatal(err)
	}
	if has(t, coll, "a", events.FieldFailureCause) || has(t, coll, "a", events.FieldFailureReason) {
		t.Error("a requeued event keeps the cause of its old failure")
	}
}

// TestSelectChoosesByEquality: a group is its stored cause and reason
// compared as text, skipped events are never chosen, and the ids come
// oldest first, as stored.
func TestSelectChoosesByEquality(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	oid := bson.NewObjectID()
	insert(t, coll,
		failedWith("a", "returned", `returned 312 NO_ROUTE for "a"`),
		failedWith(oid.Hex()+"-not-an-oid", "returned", `returned 7 NO_ROUTE for "z"`),
		failedWith("other-reason", "max_attempts", `returned 312 NO_ROUTE for "a"`),
		failedWith("skipped", "returned", `returned 312 NO_ROUTE for "a"`, field(events.FieldSkippedAt, ago(time.Minute))),
		failedWith("lookalike", "returned", `returned 312 NO_ROUTE for a`),
	)
	if _, err := coll.UpdateOne(t.Context(), bson.D{{Key: "_id", Value: "a"}}, bson.D{{Key: "$set", Value: bson.D{{Key: events.FieldCreatedAt, Value: ago(2 * time.Hour)}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ClassifyFailed(t.Context(), 100); err != nil {
		t.Fatal(err)
	}
	group := mongo.Group{Cause: `returned <n> NO_ROUTE for "…"`, Reason: "returned"}
	ids, total, err := s.Select(t.Context(), mongo.Selection{Group: &group}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]any{"a", oid.Hex() + "-not-an-oid"}, ids); diff != "" || total != 2 {
		t.Errorf("Select(group) = %d in all (-want +got):\n%s", total, diff)
	}
	pattern := mongo.Group{Cause: `returned .* NO_ROUTE for .*`, Reason: "returned"}
	if ids, total, err := s.Select(t.Context(), mongo.Selection{Group: &pattern}, 10); err != nil || total != 0 || len(ids) != 0 {
		t.Errorf("a cause that reads as a pattern chose %v (%d), %v", ids, total, err)
	}
	ids, total, err = s.Select(t.Context(), mongo.Selection{IDs: []string{"skipped", "lookalike"}}, 10)
	if err != nil || total != 1 || !slices.Equal(ids, []any{"lookalike"}) {
		t.Errorf("Select(ids) = %v, %d, %v; want lookalike only: a skipped event is not selected", ids, total, err)
	}
	if ids, total, err := s.Select(t.Context(), mongo.Selection{Group: &group}, 1); err != nil || total != 2 || len(ids) != 1 || ids[0] != "a" {
		t.Errorf("Select(group, 1) = %v, %d, %v; want the oldest of 2", ids, total, err)
	}
}

// TestFilterRequeueLeavesSkippedEvents: a requeue by type, by a selection
// or of all FAILED events leaves an event an operator skipped; one named
// by id is requeued.
func TestFilterRequeueLeavesSkippedEvents(t *testing.T) {
	t.Parallel()
	skipped := []bson.E{field(events.FieldSkippedAt, ago(time.Minute)), field(events.FieldSkippedBy, "bo")}
	for name, tt := range map[string]struct {
		filter  mongo.RequeueFilter
		wantNew []string
	}{
		"type":      {mongo.RequeueFilter{Type: "order.created"}, []string{"plain"}},
		"all":       {mongo.RequeueFilter{All: true}, []string{"plain"}},
		"selected":  {mongo.RequeueFilter{Selected: []any{"plain", "skipped"}}, []string{"plain"}},
		"id":        {mongo.RequeueFilter{IDs: []string{"skipped"}}, []string{"skipped"}},
		"id + type": {mongo.RequeueFilter{IDs: []string{"skipped", "plain"}, Type: "order.created"}, []string{"plain"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s, coll := setup(t)
			insert(t, coll, failedWith("plain", "returned", "x"), failedWith("skipped", "returned", "x", skipped...))
			if _, err := s.Requeue(t.Context(), tt.filter, false); err != nil {
				t.Fatal(err)
			}
			want := map[string]events.Status{"plain": events.StatusFailed, "skipped": events.StatusFailed}
			for _, id := range tt.wantNew {
				want[id] = events.StatusNew
			}
			if diff := cmp.Diff(want, statuses(t, coll)); diff != "" {
				t.Errorf("statuses (-want +got):\n%s", diff)
			}
		})
	}
}

// TestFailingWritesStoreTheCause: the writes that fail an event, a
// release and a stale claim's last attempt, store the cause and reason
// the groups would compute, so that the groups write nothing for them.
func TestFailingWritesStoreTheCause(t *testing.T) {
	t.Parallel()
	s, rec := mongotest.RecordingStore(t)
	coll := s.Collection()
	l := lease("w")
	claimAll(t, s, coll, l, "released")
	a := events.AttemptError{At: base, WorkerID: "w", Reason: metrics.ReasonNacked, Error: `returned 312 NO_ROUTE for "released"`}
	if _, err := s.Release(t.Context(), l, events.Release{IDs: []any{"released"}, Status: events.StatusFailed, LastError: a.Error, Attempt: &a}); err != nil {
		t.Fatal(err)
	}
	insert(t, coll, ev("stale", events.StatusProcessing, ago(2*time.Hour), field(events.FieldClaimToken, "tok"),
		field(events.FieldWorkerID, "gone"), field(events.FieldProcessingAt, ago(time.Hour)), field(events.FieldAttempts, 3)))
	if _, failed, err := s.RecoverStale(t.Context(), ago(time.Minute), time.Now().UTC(), 3); err != nil || failed != 1 {
		t.Fatalf("RecoverStale = %d failed, %v; want the stale event failed", failed, err)
	}
	rec.Take()
	g, err := s.FailureGroups(t.Context(), time.Now(), 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, sent := range rec.Take() {
		if sent.Name == "update" {
			t.Errorf("the groups stored a cause: the failing writes did not")
		}
	}
	want := []events.FailureGroup{
		{Reason: metrics.ReasonNacked, Cause: `returned <n> NO_ROUTE for "…"`, Count: 1, Example: "released"},
		{Reason: metrics.ReasonStaleMaxAttempts, Cause: "claim went stale on its last attempt (<n> of <n>): its worker stopped or hung", Count: 1, Example: "stale"},
	}
	if diff := cmp.Diff(want, g.Groups, cmpopts.IgnoreFields(events.FailureGroup{}, "Latest")); diff != "" {
		t.Errorf("groups (-want +got):\n%s", diff)
	}
}

// TestRequeueIsNotUndoneByTheGroups: the groups store the causes of
// FAILED events while an operator requeues them. On FerretDB a guarded
// update reads, then rewrites each whole document: a cause stored from a
// read made before the requeue would write the event back to FAILED.
// Every requeued event stays NEW.
func TestRequeueIsNotUndoneByTheGroups(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	for round := range 10 {
		var ids []string
		var docs []bson.D
		for i := range 20 {
			id := fmt.Sprintf("r%d-%d", round, i)
			ids = append(ids, id)
			docs = append(docs, failedWith(id, "returned", fmt.Sprintf("returned %d NO_ROUTE", i)))
		}
		insert(t, coll, docs...)
		var wg sync.WaitGroup
		wg.Go(func() {
			if _, err := s.FailureGroups(t.Context(), time.Now(), 1000); err != nil {
				t.Error(err)
			}
		})
		wg.Go(func() {
			if n, err := s.Requeue(t.Context(), mongo.RequeueFilter{IDs: ids}, false); err != nil || n != len(ids) {
				t.Errorf("requeue = %d, %v; want %d", n, err, len(ids))
			}
		})
		wg.Wait()
		n, err := coll.CountDocuments(t.Context(), bson.D{{Key: events.FieldStatus, Value: events.StatusFailed}, {Key: events.FieldID, Value: bson.D{{Key: "$in", Value: ids}}}})
		if err != nil || n != 0 {
			t.Fatalf("round %d: %d requeued events FAILED again, %v; want none", round, n, err)
		}
	}
}
