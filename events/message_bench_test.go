package events

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/internal/benchorder"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// benchEvent is an event as the bench's producer writes it: an aggregate
// and an order payload whose JSON body is about 300 bytes.
func benchEvent(b *testing.B, i int) bson.Raw {
	b.Helper()
	d, err := Draft{
		Type:          benchorder.Type,
		AggregateType: benchorder.AggregateType,
		AggregateID:   benchorder.AggregateID(i),
		Payload:       benchorder.Payload(i),
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
