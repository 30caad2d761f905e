package events

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// benchEvent is an event as the bench's producer writes it: an aggregate
// and an order payload whose JSON body is about 300 bytes.
func benchEvent(b *testing.B, i int) bson.Raw {
	b.Helper()
	d, err := Draft{
		Type:          "order.created",
		AggregateType: "order",
		AggregateID:   fmt.Sprintf("order-%08d", i),
		Payload: bson.D{
			{Key: "orderId", Value: fmt.Sprintf("order-%08d", i)},
			{Key: "customerId", Value: fmt.Sprintf("customer-%06d", i%100000)},
			{Key: "amount", Value: 1999 + i%1000},
			{Key: "currency", Value: "EUR"},
			{Key: "note", Value: strings.Repeat("n", 190)},
		},
	}.Document(time.Now())
	if err != nil {
		b.Fatal(err)
	}
	return testenv.Marshal(b, d)
}

func BenchmarkNewMessage(b *testing.B) {
	doc := benchEvent(b, 1)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := NewMessage(doc, 0); err != nil {
			b.Fatal(err)
		}
	}
}
