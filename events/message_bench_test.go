package events

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// benchEvent is an event as the bench's producer writes it
// (internal/benchorder of the relay's module, which this module cannot
// import; keep the two alike): an aggregate and an order payload whose
// JSON body is about 300 bytes.
func benchEvent(b *testing.B, i int) bson.Raw {
	b.Helper()
	id := fmt.Sprintf("order-%08d", i)
	d, err := Draft{
		Type:          "order.created",
		AggregateType: "order",
		AggregateID:   id,
		Payload: bson.D{
			{Key: "orderId", Value: id},
			{Key: "customerId", Value: fmt.Sprintf("customer-%06d", i%100000)},
			{Key: "amount", Value: 1999 + i%1000},
			{Key: "currency", Value: "EUR"},
			{Key: "note", Value: strings.Repeat("n", 190)},
		},
	}.Document(time.Now())
	if err != nil {
		b.Fatal(err)
	}
	return marshal(b, d)
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

// The CloudEvents formats, for comparison with BenchmarkNewMessage (plain).
func BenchmarkFormatNewMessage(b *testing.B) {
	doc := benchEvent(b, 1)
	for _, f := range []Format{
		{Name: FormatPlain},
		{Name: FormatCloudEventsBinary, Source: "/outbox/outbox/events"},
		{Name: FormatCloudEventsStructured, Source: "/outbox/outbox/events"},
	} {
		b.Run(f.Name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := f.NewMessage(doc, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
