package testenv

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestMessageID(t *testing.T) {
	t.Parallel()
	oid := bson.NewObjectID()
	for _, tt := range []struct {
		id   any
		want string
	}{{oid, oid.Hex()}, {"order-1", "order-1"}, {int32(7), "7"}} {
		if got := MessageID(tt.id); got != tt.want {
			t.Errorf("MessageID(%#v) = %q, want %q", tt.id, got, tt.want)
		}
	}
}
