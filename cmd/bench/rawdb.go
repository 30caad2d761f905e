package main

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

// The raw database loop's rate, and how fast the harness wrote its
// backlog.
var (
	insertFig = figure[Rate]{"backlogInsert"}
	rawDBFig  = figure[Rate]{"rawDatabaseLoop"}
)

var rawDBStage = stage{
	key: "raw-db", figures: []anyFigure{insertFig, rawDBFig},
	steps: one("raw database loop", (*bench).rawDB),
	rows: rateRow(rawDBFig, "events", func(r *Results) string {
		return fmt.Sprintf("Raw database limit (own loop: find %d NEW ids, claim UpdateMany, mark UpdateMany)", r.Config.BatchSize)
	}),
}

// rawDB measures the database's limit for the relay's access pattern with
// the harness's own loop, no broker: find the ids of the oldest batch of
// NEW events, claim them with one UpdateMany, mark them PUBLISHED with
// another, until the backlog is gone. The backlog is the size of each
// worker run's.
func (b *bench) rawDB(ctx context.Context) error {
	coll, _, err := b.preparedCollection(ctx, "raw_loop")
	if err != nil {
		return err
	}
	defer dropQuietly(coll)
	t0 := time.Now()
	if _, err := insertEvents(ctx, coll, b.cfg.Backlog, 0, eventDoc); err != nil {
		return err
	}
	insert := time.Since(t0)
	fmt.Fprintf(b.out, "   inserted %d NEW events in %.1fs (%.0f/s)\n", b.cfg.Backlog, insert.Seconds(), float64(b.cfg.Backlog)/insert.Seconds())
	insertFig.set(b.res, rateOf(b.cfg.Backlog, insert))

	relayed, batches, elapsed, err := rawLoop(ctx, coll, b.cfg.BatchSize)
	if err != nil {
		return err
	}
	if relayed != b.cfg.Backlog {
		return fmt.Errorf("raw loop relayed %d events of %d", relayed, b.cfg.Backlog)
	}
	rate := rateOf(relayed, elapsed)
	rawDBFig.set(b.res, rate)
	fmt.Fprintf(b.out, "   find %d + claim + mark, %d batches: %d events in %.1fs: %.0f/s\n",
		b.cfg.BatchSize, batches, relayed, elapsed.Seconds(), rate.PerSecond)
	return nil
}

// rawLoop runs rawBatch on coll until no NEW event is left and returns
// how many events it relayed, in how many batches, and how long it took.
func rawLoop(ctx context.Context, coll *driver.Collection, size int) (relayed, batches int, elapsed time.Duration, err error) {
	start := time.Now()
	for {
		n, err := rawBatch(ctx, coll, size, batches)
		if err != nil {
			return relayed, batches, time.Since(start), err
		}
		if n == 0 {
			return relayed, batches, time.Since(start), nil
		}
		relayed += n
		batches++
	}
}

// rawBatch is one turn of the raw loop: three commands.
func rawBatch(ctx context.Context, coll *driver.Collection, size, seq int) (int, error) {
	cur, err := coll.Find(ctx, bson.D{{Key: events.FieldStatus, Value: events.StatusNew}},
		options.Find().
			SetSort(bson.D{{Key: events.FieldCreatedAt, Value: 1}}).
			SetProjection(bson.D{{Key: events.FieldID, Value: 1}}).
			SetLimit(int64(size)).
			SetBatchSize(int32(size)))
	if err != nil {
		return 0, fmt.Errorf("find: %w", err)
	}
	var ids []any
	for cur.Next(ctx) {
		ids = append(ids, cur.Current.Lookup(events.FieldID).ObjectID())
	}
	_ = cur.Close(ctx)
	if err := cur.Err(); err != nil || len(ids) == 0 {
		return 0, err
	}
	now := time.Now().UTC()
	in := bson.D{{Key: "$in", Value: ids}}
	if _, err := coll.UpdateMany(ctx,
		bson.D{{Key: events.FieldStatus, Value: events.StatusNew}, {Key: events.FieldID, Value: in}},
		bson.D{
			{Key: "$set", Value: bson.D{
				{Key: events.FieldStatus, Value: events.StatusProcessing},
				{Key: events.FieldWorkerID, Value: "bench-raw"},
				{Key: events.FieldProcessingAt, Value: now},
				{Key: events.FieldClaimToken, Value: fmt.Sprint(seq)},
			}},
			{Key: "$inc", Value: bson.D{{Key: events.FieldAttempts, Value: 1}}},
		}); err != nil {
		return 0, fmt.Errorf("claim: %w", err)
	}
	if _, err := coll.UpdateMany(ctx,
		bson.D{{Key: events.FieldStatus, Value: events.StatusProcessing}, {Key: events.FieldID, Value: in}},
		bson.D{{Key: "$set", Value: bson.D{
			{Key: events.FieldStatus, Value: events.StatusPublished},
			{Key: events.FieldPublishedAt, Value: now},
		}}}); err != nil {
		return 0, fmt.Errorf("mark: %w", err)
	}
	return len(ids), nil
}

// preparedCollection is a fresh collection named name with the worker's
// indexes, created by the worker's own mongo.Store.Prepare, so every
// stage runs on the same footing; and the store over it. The caller drops
// the collection.
func (b *bench) preparedCollection(ctx context.Context, name string) (*driver.Collection, *mongo.Store, error) {
	coll, err := b.collection(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	store := b.store(b.client, coll)
	if err := store.Prepare(ctx); err != nil {
		dropQuietly(coll)
		return nil, nil, fmt.Errorf("create indexes: %w", err)
	}
	return coll, store, nil
}

// store is the worker's mongo.Store over coll, through client.
func (b *bench) store(client *driver.Client, coll *driver.Collection) *mongo.Store {
	return mongo.New(client, mongo.Config{Database: databaseName, Collection: coll.Name(), Logger: b.logger})
}
