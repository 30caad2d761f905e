package claim

import (
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// benchBatch is a claimed batch of n events spread over aggregates, each
// aggregate perAggregate events deep, in claim order.
func benchBatch(b *testing.B, n, perAggregate int) []events.Claimed {
	b.Helper()
	batch := make([]events.Claimed, n)
	for i := range batch {
		d, err := events.Draft{
			Type: "order.updated", AggregateType: "order", AggregateID: fmt.Sprintf("order-%06d", i/perAggregate),
			Payload: bson.D{{Key: "step", Value: i % perAggregate}},
		}.Document(time.Now())
		if err != nil {
			b.Fatal(err)
		}
		raw := testenv.Marshal(b, d)
		batch[i] = events.Claimed{ID: i, Doc: raw}
	}
	return batch
}

// Round planning runs once per claimed batch, before its first publish.
func BenchmarkPlanRounds(b *testing.B) {
	for _, depth := range []int{1, 10, 500} {
		b.Run(fmt.Sprintf("batch500-depth%d", depth), func(b *testing.B) {
			batch := benchBatch(b, 500, depth)
			b.ReportAllocs()
			for b.Loop() {
				rounds, _ := planRounds(batch)
				if len(rounds) != depth {
					b.Fatalf("%d rounds, want %d", len(rounds), depth)
				}
			}
		})
	}
}
