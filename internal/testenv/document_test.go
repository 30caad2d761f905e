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
