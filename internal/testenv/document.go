package testenv

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// HasField reports whether the document with _id id in coll has the field
// key at all, even as null: tests check that a write removed a field, not
// only that it emptied it. It fails the test if there is no such document.
func HasField(t testing.TB, coll *mongo.Collection, id any, key string) bool {
	t.Helper()
	raw, err := coll.FindOne(t.Context(), bson.D{{Key: "_id", Value: id}}).Raw()
	if err != nil {
		t.Fatalf("testenv: find document %v: %v", id, err)
	}
	_, err = raw.LookupErr(key)
	return err == nil
}

// Marshal returns v as a BSON document, failing the test if it does not
// marshal: the raw documents tests hand to what reads the stored events.
func Marshal(t testing.TB, v any) bson.Raw {
	t.Helper()
	raw, err := bson.Marshal(v)
	if err != nil {
		t.Fatalf("testenv: marshal %T: %v", v, err)
	}
	return raw
}
