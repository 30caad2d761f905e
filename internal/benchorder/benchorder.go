// Package benchorder is the order event that the bench inserts. The
// events package's benchmarks parse the same document, built in their own
// file (events/message_bench_test.go): events is a module of its own and
// cannot import this one's internal packages. Change both together.
package benchorder

import (
	"fmt"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
)

const (
	// Type is the event type, and so the routing key.
	Type = "order.created"
	// AggregateType is the aggregate every order event is about.
	AggregateType = "order"
)

// Note pads every payload so that its JSON body is about 300 bytes, the
// size of the bench's raw broker messages.
var Note = strings.Repeat("n", 190)

// AggregateID is the aggregate of order i: one order, one aggregate.
func AggregateID(i int) string { return fmt.Sprintf("order-%08d", i) }

// Payload is the body of order i, about 300 bytes as JSON.
func Payload(i int) bson.D {
	return bson.D{
		{Key: "orderId", Value: AggregateID(i)},
		{Key: "customerId", Value: fmt.Sprintf("customer-%06d", i%100000)},
		{Key: "amount", Value: 1999 + i%1000},
		{Key: "currency", Value: "EUR"},
		{Key: "note", Value: Note},
	}
}
