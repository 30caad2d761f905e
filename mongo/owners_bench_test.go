package mongo

import (
	"strconv"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/ownership"
)

// BenchmarkReadOwners decodes what one ownership round reads: two terms
// per partition and four members.
func BenchmarkReadOwners(b *testing.B) {
	now := time.Now().UTC().Truncate(time.Millisecond)
	var docs []any
	for p := range events.Partitions {
		for term := int64(1); term <= 2; term++ {
			t := ownership.Term{Partition: p, Term: term, Owner: "worker-1", ExpiresAt: now}
			docs = append(docs, ownerDoc{ID: t.ID(), Partition: p, Term: term, Owner: t.Owner, ExpiresAt: now, CreatedAt: now})
		}
	}
	for i := range 4 {
		id := "worker-" + strconv.Itoa(i)
		docs = append(docs, ownerDoc{ID: memberPrefix + id, WorkerID: id, SeenAt: now})
	}
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer() // making the cursor marshals the documents
		cur, err := mongo.NewCursorFromDocuments(docs, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		terms, members, err := (&Owners{}).readOwners(b.Context(), cur)
		if err != nil || len(terms) != 2*events.Partitions || len(members) != 4 {
			b.Fatalf("readOwners = %d terms, %d members, %v", len(terms), len(members), err)
		}
	}
}
