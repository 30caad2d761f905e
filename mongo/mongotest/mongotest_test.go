package mongotest

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
)

func TestEventIsStoredAndReadBack(t *testing.T) {
	t.Parallel()
	coll := Store(t).Collection()
	at := time.Date(2025, 3, 4, 12, 0, 0, 0, time.UTC)
	doc := Event("e-1", events.StatusNew, at, bson.E{Key: events.FieldAttempts, Value: 2})
	if _, err := coll.InsertOne(t.Context(), doc); err != nil {
		t.Fatalf("insert: %v", err)
	}
	var got events.Event
	if err := coll.FindOne(t.Context(), bson.D{{Key: events.FieldID, Value: "e-1"}}).Decode(&got); err != nil {
		t.Fatalf("read back: %v", err)
	}
	if got.Type != "order.created" || got.Status != events.StatusNew || !got.CreatedAt.Equal(at) || got.Attempts != 2 {
		t.Errorf("read back %+v, want order.created NEW created at %s with 2 attempts", got, at)
	}
}

func TestStatusesByMessageID(t *testing.T) {
	t.Parallel()
	coll := Store(t).Collection()
	oid := bson.NewObjectID()
	at := time.Date(2025, 3, 4, 12, 0, 0, 0, time.UTC)
	Insert(t, coll, Event(oid, events.StatusFailed, at), Event("e-1", events.StatusNew, at))
	want := map[string]events.Status{oid.Hex(): events.StatusFailed, "e-1": events.StatusNew}
	if diff := cmp.Diff(want, Statuses(t, coll)); diff != "" {
		t.Errorf("Statuses (-want +got):\n%s", diff)
	}
}

func TestIDsAndMessageIDsKeepClaimOrder(t *testing.T) {
	t.Parallel()
	oid := bson.NewObjectID()
	claimed := []events.Claimed{{ID: "e-2"}, {ID: oid}, {ID: int32(7)}}
	if diff := cmp.Diff([]any{"e-2", oid, int32(7)}, IDs(claimed)); diff != "" {
		t.Errorf("IDs (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"e-2", oid.Hex(), "7"}, MessageIDs(claimed)); diff != "" {
		t.Errorf("MessageIDs (-want +got):\n%s", diff)
	}
}
