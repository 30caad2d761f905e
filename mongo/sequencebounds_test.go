package mongo_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

// TestSequenceCheckBoundsEachAggregate: a batch that holds a new
// aggregate's version 1 beside version 301 of an aggregate with 300
// versions PUBLISHED makes the claim's sequence check read none of that
// history where the server plans an $or on an index (MongoDB's lane):
// each aggregate is bounded by its own versions, not all by the batch's
// lowest.
func TestSequenceCheckBoundsEachAggregate(t *testing.T) {
	t.Parallel()
	s, publishedRead := publishedReadingStore(t)
	mongo.SetSplitClaim(s, true)
	at := ago(time.Hour)
	var docs []bson.D
	for v := 1; v <= 300; v++ {
		docs = append(docs, ev(fmt.Sprintf("b%03d", v), events.StatusPublished, at.Add(time.Duration(v)*time.Millisecond), seq("b", int64(v))...))
	}
	docs = append(docs,
		ev("b301", events.StatusNew, at.Add(time.Second), seq("b", int64(301))...),
		ev("a1", events.StatusNew, at.Add(2*time.Second), seq("a", int64(1))...),
	)
	insert(t, s.Collection(), docs...)
	if diff := cmp.Diff([]string{"b301", "a1"}, claimOrdered(t, s, "t1", 10)); diff != "" {
		t.Errorf("claimed (-want +got):\n%s", diff)
	}
	if got := publishedRead(); got != 0 {
		t.Errorf("the sequence check read %d PUBLISHED events, want 0: b's history is below its batch's version 301", got)
	}
}

// publishedReadingStore returns a prepared store on a database of its own
// whose client counts the documents the finds on PUBLISHED events return.
func publishedReadingStore(t *testing.T) (*mongo.Store, func() int) {
	t.Helper()
	var mu sync.Mutex
	published := map[int64]bool{}
	read := 0
	monitor := &event.CommandMonitor{
		Started: func(_ context.Context, e *event.CommandStartedEvent) {
			if e.CommandName != "find" {
				return
			}
			filter, _ := e.Command.Lookup("filter").DocumentOK()
			mu.Lock()
			published[e.RequestID] = bytes.Contains(filter, []byte(events.StatusPublished))
			mu.Unlock()
		},
		Succeeded: func(_ context.Context, e *event.CommandSucceededEvent) {
			mu.Lock()
			defer mu.Unlock()
			if published[e.RequestID] {
				batch, _ := e.Reply.Lookup("cursor", "firstBatch").ArrayOK()
				docs, _ := batch.Values()
				read += len(docs)
			}
		},
	}
	return monitoredStore(t, monitor), func() int {
		mu.Lock()
		defer mu.Unlock()
		return read
	}
}
