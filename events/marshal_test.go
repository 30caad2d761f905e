package events

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// marshal returns v as a BSON document, failing the test if it does not
// marshal: the raw documents tests hand to what reads the stored events.
func marshal(t testing.TB, v any) bson.Raw {
	t.Helper()
	raw, err := bson.Marshal(v)
	if err != nil {
		t.Fatalf("marshal %T: %v", v, err)
	}
	return raw
}
