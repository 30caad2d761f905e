package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// insertBacklog inserts n NEW events of type typ, insertChunk per
// InsertMany, and returns their ids as message ids (ObjectID hex).
func insertBacklog(ctx context.Context, t *testing.T, coll *driver.Collection, n int, typ string) []string {
	t.Helper()
	ids := make([]string, 0, n)
	docs := make([]any, 0, insertChunk)
	for i := range n {
		d, err := events.Draft{
			Type:          typ,
			AggregateType: "e2e",
			AggregateID:   strconv.Itoa(i),
			Payload:       bson.D{{Key: "n", Value: i}},
		}.Document(time.Now())
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, testenv.MessageID(d[0].Value))
		docs = append(docs, d)
		if len(docs) == insertChunk || i == n-1 {
			if _, err := coll.InsertMany(ctx, docs); err != nil {
				t.Fatalf("insert events %d..%d: %v", i+1-len(docs), i, err)
			}
			docs = docs[:0]
		}
	}
	return ids
}

// draftDoc returns the document of d created at, with fields set as
// setFields does.
func draftDoc(t *testing.T, d events.Draft, at time.Time, fields ...bson.E) bson.D {
	t.Helper()
	doc, err := d.Document(at)
	if err != nil {
		t.Fatalf("document of %+v: %v", d, err)
	}
	return setFields(doc, fields...)
}

// setFields returns d with each field of kv set: replaced where d has it,
// appended where not.
func setFields(d bson.D, kv ...bson.E) bson.D {
	for _, e := range kv {
		i := slices.IndexFunc(d, func(x bson.E) bool { return x.Key == e.Key })
		if i >= 0 {
			d[i] = e
		} else {
			d = append(d, e)
		}
	}
	return d
}

func findIDs(ctx context.Context, t *testing.T, coll *driver.Collection, filter bson.D) []any {
	t.Helper()
	cur, err := coll.Find(ctx, filter, options.Find().SetProjection(bson.D{{Key: events.FieldID, Value: 1}}))
	if err != nil {
		t.Fatalf("find ids: %v", err)
	}
	var docs []struct {
		ID any `bson:"_id"`
	}
	if err := cur.All(ctx, &docs); err != nil {
		t.Fatalf("read ids: %v", err)
	}
	ids := make([]any, len(docs))
	for i, d := range docs {
		ids[i] = d.ID
	}
	return ids
}

func countOf(ctx context.Context, t *testing.T, coll *driver.Collection, status events.Status) int64 {
	t.Helper()
	n, err := coll.CountDocuments(ctx, bson.D{{Key: events.FieldStatus, Value: status}})
	if err != nil {
		t.Fatalf("count %s: %v", status, err)
	}
	return n
}

// statusCounts counts documents by status, for failure messages and logs.
func statusCounts(t *testing.T, coll *driver.Collection) map[events.Status]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 30*time.Second)
	defer cancel()
	out := map[events.Status]int64{}
	for _, s := range events.Statuses {
		out[s] = countOf(ctx, t, coll, s)
	}
	return out
}

// waitCount waits until filter matches want documents, until ctx's
// deadline.
func waitCount(ctx context.Context, t *testing.T, coll *driver.Collection, filter bson.D, want int64) {
	t.Helper()
	explained(t, coll, func() {
		testenv.Eventually(t, timeLeft(ctx), func() (bool, string) {
			got, err := coll.CountDocuments(ctx, filter)
			return err == nil && got == want, fmt.Sprintf("%d documents matching %v, want %d (error %v)", got, filter, want, err)
		})
	})
}

// explained runs wait and, if wait fails the test, logs coll's documents
// by status, which say where the relay stalled.
func explained(t *testing.T, coll *driver.Collection, wait func()) {
	t.Helper()
	waited := false
	defer func() {
		if !waited {
			t.Logf("documents by status: %v", statusCounts(t, coll))
		}
	}()
	wait()
	waited = true
}

// timeLeft is what remains of ctx's deadline, for a wait bounded by the
// scenario's timeout; testenv.WaitTimeout if ctx has none.
func timeLeft(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return time.Until(d)
	}
	return testenv.WaitTimeout
}
