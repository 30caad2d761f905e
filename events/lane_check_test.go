package events_test

import (
	"errors"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
)

// TestCheckLane: the values that would leave an event outside every lane,
// or parked for good, are refused with an error naming the field; the
// worker's own values pass.
func TestCheckLane(t *testing.T) {
	t.Parallel()
	doc := func(extra ...bson.E) bson.Raw {
		d := append(bson.D{{Key: events.FieldID, Value: "e"}, {Key: events.FieldAggregateID, Value: "k"}}, extra...)
		raw, err := bson.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	for name, tc := range map[string]struct {
		doc   bson.Raw
		field string // "" for none
	}{
		"absent":         {doc(bson.E{Key: events.FieldAggregateType, Value: "order"}), ""},
		"parked true":    {doc(bson.E{Key: events.FieldParked, Value: true}), ""},
		"parked null":    {doc(bson.E{Key: events.FieldParked, Value: nil}), ""},
		"parked false":   {doc(bson.E{Key: events.FieldParked, Value: false}), events.FieldParked},
		"parked string":  {doc(bson.E{Key: events.FieldParked, Value: "yes"}), events.FieldParked},
		"NUL in type":    {doc(bson.E{Key: events.FieldAggregateType, Value: "or\x00der"}), events.FieldAggregateType},
		"NUL in id only": {doc(bson.E{Key: events.FieldAggregateType, Value: "order"}, bson.E{Key: "x", Value: "a\x00b"}), ""},
	} {
		err := events.CheckLane(tc.doc)
		var inv *events.InvalidError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%s: CheckLane = %v, want nil", name, err)
		case tc.field != "" && (!errors.As(err, &inv) || inv.Field != tc.field):
			t.Errorf("%s: CheckLane = %v, want an *InvalidError naming %s", name, err, tc.field)
		}
		if _, err := events.CheckManaged(tc.doc); (err == nil) != (tc.field == "") {
			t.Errorf("%s: CheckManaged = %v, want it to agree with CheckLane", name, err)
		}
	}
}
