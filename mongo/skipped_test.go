package mongo_test

import (
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

// TestSkippedFlag: a skip writes skipped: true beside skippedAt (an
// equality FerretDB pushes down, so that a claim's read of the FAILED
// events that hold their aggregates decodes none of the skipped ones), a
// requeue removes it, and the claims hold nothing behind a skipped event,
// whether it carries the flag or was skipped before it existed
// (skippedAt alone); a FAILED event not skipped still holds.
func TestSkippedFlag(t *testing.T) {
	t.Parallel()
	eachClaimStrategy(t, func(t *testing.T, s *mongo.Store, coll *driver.Collection) {
		failed := func(id, agg string) bson.D {
			d := laneEvent(id, "order.created", agg, 0)
			d[3].Value = events.StatusFailed
			return d
		}
		old := append(failed("old", "b"), field(events.FieldSkippedAt, base))
		insert(t, coll, failed("skip", "a"), old, failed("holds", "c"),
			laneEvent("a2", "order.created", "a", 10), laneEvent("b2", "order.created", "b", 11), laneEvent("c2", "order.created", "c", 12))
		if n, err := s.Skip(t.Context(), []string{"skip"}, "op", "test", time.Now(), false); err != nil || n != 1 {
			t.Fatalf("Skip = %d, %v", n, err)
		}
		var doc bson.M
		if err := coll.FindOne(t.Context(), bson.D{{Key: events.FieldID, Value: "skip"}}).Decode(&doc); err != nil {
			t.Fatal(err)
		}
		if doc[events.FieldSkipped] != true {
			t.Errorf("skipped event's %s = %v, want true", events.FieldSkipped, doc[events.FieldSkipped])
		}
		got := claimLane(t, s, "t", events.ClaimLimit{Events: 10, Ordered: true, FailedHolds: true})
		slices.Sort(got)
		if !slices.Equal(got, []string{"a2", "b2"}) {
			t.Errorf("claimed %v, want [a2 b2]: behind the skipped events, not behind the FAILED one", got)
		}
		if n, err := s.Requeue(t.Context(), mongo.RequeueFilter{IDs: []string{"skip"}}, false); err != nil || n != 1 {
			t.Fatalf("Requeue = %d, %v", n, err)
		}
		doc = nil
		if err := coll.FindOne(t.Context(), bson.D{{Key: events.FieldID, Value: "skip"}}).Decode(&doc); err != nil {
			t.Fatal(err)
		}
		if _, ok := doc[events.FieldSkipped]; ok {
			t.Errorf("requeued event keeps %s = %v, want it removed", events.FieldSkipped, doc[events.FieldSkipped])
		}
	})
}
