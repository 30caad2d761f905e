package mongo_test

import (
	"errors"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

// TestSelectionsHoldOnlyIDs: a selection whose element is no _id value
// (a regular expression, a document) changes nothing, whether skipped,
// requeued or read back.
func TestSelectionsHoldOnlyIDs(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	for _, id := range []string{"a", "b", "c"} {
		insert(t, coll, ev(id, events.StatusFailed, ago(time.Hour), field(events.FieldLastError, "nacked")))
	}
	for name, sel := range map[string][]any{
		"regex":    {bson.Regex{Pattern: ".*"}},
		"operator": {"a", bson.D{{Key: "$gt", Value: ""}}},
		"null":     {nil},
	} {
		if n, err := s.SkipSelected(t.Context(), sel, "eve", "forged", time.Now(), bson.NewObjectID()); !errors.Is(err, mongo.ErrNotAnID) || n != 0 {
			t.Errorf("%s: SkipSelected = %d, %v; want 0 and ErrNotAnID", name, n, err)
		}
		if n, err := s.Requeue(t.Context(), mongo.RequeueFilter{Selected: sel}, false); !errors.Is(err, mongo.ErrNotAnID) || n != 0 {
			t.Errorf("%s: Requeue = %d, %v; want 0 and ErrNotAnID", name, n, err)
		}
		if _, err := s.Touched(t.Context(), bson.NewObjectID(), sel); !errors.Is(err, mongo.ErrNotAnID) {
			t.Errorf("%s: Touched = %v; want ErrNotAnID", name, err)
		}
	}
	for _, id := range []string{"a", "b", "c"} {
		if e := get(t, coll, id); e.Status != events.StatusFailed {
			t.Errorf("%s is %s, want FAILED", id, e.Status)
		}
	}
}

// TestActionsStampTheirEvents: a requeue and a skip stamp every event
// they change with their record's id, adding to earlier stamps, and
// Touched reads back those of a list that carry one.
func TestActionsStampTheirEvents(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	oid := bson.NewObjectID()
	insert(t, coll, ev("a", events.StatusFailed, ago(3*time.Hour)), ev("b", events.StatusFailed, ago(2*time.Hour)),
		ev("c", events.StatusFailed, ago(time.Hour)))
	insert(t, coll, bson.D{{Key: "_id", Value: oid}, {Key: "status", Value: events.StatusFailed}, {Key: "type", Value: "t"}, {Key: "createdAt", Value: ago(time.Minute)}})
	skip, requeue := bson.NewObjectID(), bson.NewObjectID()
	if n, err := s.SkipSelected(t.Context(), []any{"a", "b", oid}, "ana", "r", time.Now(), skip); err != nil || n != 3 {
		t.Fatalf("SkipSelected = %d, %v", n, err)
	}
	if n, err := s.Requeue(t.Context(), mongo.RequeueFilter{IDs: []string{"a"}, Action: requeue}, false); err != nil || n != 1 {
		t.Fatalf("Requeue = %d, %v", n, err)
	}
	got, err := s.Touched(t.Context(), skip, []any{"a", "b", "c", oid})
	if err != nil || len(got) != 3 || got[0] != "a" || got[1] != "b" || got[2] != oid {
		t.Errorf("Touched(skip) = %v, %v; want a, b and the ObjectID, oldest first", got, err)
	}
	got, err = s.Touched(t.Context(), requeue, []any{"a", "b", "c"})
	if err != nil || len(got) != 1 || got[0] != "a" {
		t.Errorf("Touched(requeue) = %v, %v; want a alone", got, err)
	}
}
