package testenv

import (
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// MessageID is an event's _id as the worker writes it into the message id
// of what it publishes: the hex of an ObjectID, else the id as text. Tests
// match what a queue received with what they inserted by it.
func MessageID(id any) string {
	if oid, ok := id.(bson.ObjectID); ok {
		return oid.Hex()
	}
	return fmt.Sprint(id)
}
