package mongo_test

import (
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo/mongotest"
)

// BenchmarkReadClaimable times the claim's read of a batch of 500 on a
// backlog of 2,000 NEW events, three to an aggregate (the claim-latency
// stage of cmd/bench, without the write), with per-aggregate ordering and
// without; the read changes nothing, so every iteration reads the same
// backlog. It needs the test database (embedded FerretDB, or
// OUTBOX_TEST_MONGO_URI), like the store's tests.
func BenchmarkReadClaimable(b *testing.B) {
	const backlog, batch = 2000, 500
	s := mongotest.Store(b)
	docs := make([]bson.D, backlog)
	for i := range docs {
		docs[i] = mongotest.Event(fmt.Sprintf("e-%05d", i), events.StatusNew, base.Add(time.Duration(i)*time.Millisecond),
			bson.E{Key: events.FieldAggregateType, Value: "order"},
			bson.E{Key: events.FieldAggregateID, Value: fmt.Sprintf("order-%d", i/3)})
	}
	mongotest.Insert(b, s.Collection(), docs...)
	for _, ordered := range []bool{true, false} {
		b.Run(fmt.Sprintf("ordered=%t", ordered), func(b *testing.B) {
			limit := events.ClaimLimit{Events: batch, Ordered: ordered, Draining: true}
			b.ReportAllocs()
			for b.Loop() {
				got, _, err := s.ReadClaimable(b.Context(), base.Add(time.Hour), limit)
				if err != nil || len(got) != batch {
					b.Fatalf("ReadClaimable = %d events, %v; want %d", len(got), err, batch)
				}
			}
		})
	}
}
