package main

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/benchorder"
)

// insertChunk is how many documents one InsertMany writes.
const insertChunk = 1000

// eventDoc is a NEW event as a producer writes it (events.Draft), with an
// order payload whose JSON body is about 300 bytes.
func eventDoc(i int, createdAt time.Time) (bson.D, error) {
	d := events.Draft{
		Type:          benchorder.Type,
		AggregateType: benchorder.AggregateType,
		AggregateID:   benchorder.AggregateID(i),
		Payload:       benchorder.Payload(i),
	}
	return d.Document(createdAt)
}

// skippedFailedDoc is an event that failed an hour ago and that an
// operator skipped, as this release's skip writes it (skipped: true beside
// skippedAt): history that holds no aggregate, of aggregates of its own
// (far past the backlogs' ids).
func skippedFailedDoc(i int, createdAt time.Time) (bson.D, error) {
	at := createdAt.Add(-time.Hour)
	return settledDoc(skippedIDBase+i, at, events.StatusFailed,
		bson.E{Key: events.FieldLastError, Value: "returned 312 NO_ROUTE"},
		bson.E{Key: events.FieldFailedAt, Value: at},
		bson.E{Key: events.FieldSkippedAt, Value: at},
		bson.E{Key: events.FieldSkipped, Value: true},
		bson.E{Key: events.FieldAttempts, Value: 5},
	)
}

// skippedIDBase puts skippedFailedDoc's aggregates past every backlog's.
const skippedIDBase = 10_000_000

// publishedDoc is an event already relayed: history that a claim must
// never read.
func publishedDoc(i int, createdAt time.Time) (bson.D, error) {
	return settledDoc(i, createdAt, events.StatusPublished,
		bson.E{Key: events.FieldWorkerID, Value: "bench-history"},
		bson.E{Key: events.FieldProcessingAt, Value: createdAt},
		bson.E{Key: events.FieldAttempts, Value: 1},
		bson.E{Key: events.FieldPublishedAt, Value: createdAt},
	)
}

// settledDoc is event i, written at createdAt, as status with fields.
func settledDoc(i int, createdAt time.Time, status events.Status, fields ...bson.E) (bson.D, error) {
	doc, err := eventDoc(i, createdAt)
	if err != nil {
		return nil, err
	}
	for j := range doc {
		if doc[j].Key == events.FieldStatus {
			doc[j].Value = status
		}
	}
	return append(doc, fields...), nil
}

// insertEvents inserts n documents made by mk in chunks of insertChunk,
// stopping early when budget (if positive) runs out. It returns how many
// it inserted.
func insertEvents(ctx context.Context, coll *driver.Collection, n int, budget time.Duration,
	mk func(i int, createdAt time.Time) (bson.D, error)) (int, error) {
	start := time.Now()
	done := 0
	for done < n {
		if budget > 0 && time.Since(start) > budget {
			break
		}
		size := min(insertChunk, n-done)
		docs := make([]any, size)
		now := time.Now()
		for j := range docs {
			doc, err := mk(done+j, now)
			if err != nil {
				return done, err
			}
			docs[j] = doc
		}
		if _, err := coll.InsertMany(ctx, docs, options.InsertMany().SetOrdered(false)); err != nil {
			return done, fmt.Errorf("insert events %d to %d: %w", done, done+size, err)
		}
		done += size
	}
	return done, nil
}

// value returns the value of key in doc, or nil.
func value(doc bson.D, key string) any {
	for _, e := range doc {
		if e.Key == key {
			return e.Value
		}
	}
	return nil
}
