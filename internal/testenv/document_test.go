package testenv

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestHasField(t *testing.T) {
	t.Parallel()
	coll := Database(t).Collection("events")
	doc := bson.D{{Key: "_id", Value: "e1"}, {Key: "set", Value: "x"}, {Key: "null", Value: nil}}
	if _, err := coll.InsertOne(t.Context(), doc); err != nil {
		t.Fatalf("InsertOne: %v", err)
	}
	for key, want := range map[string]bool{"set": true, "null": true, "absent": false} {
		if got := HasField(t, coll, "e1", key); got != want {
			t.Errorf("HasField(%q) = %t, want %t", key, got, want)
		}
	}
}

func TestMarshal(t *testing.T) {
	t.Parallel()
	raw := Marshal(t, bson.D{{Key: "_id", Value: "e1"}})
	if got := raw.Lookup("_id").StringValue(); got != "e1" {
		t.Errorf("_id of the marshalled document = %q, want e1", got)
	}
	r := &skipRecorder{TB: t}
	Marshal(r, "not a document")
	if r.failed == "" {
		t.Error("Marshal of a string: the test did not fail")
	}
}
