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

// The raw database loops' rates, and how fast the harness wrote its
// backlog. rawDBFig is the loop that reads the head in createdAt order
// through the worker's {status, createdAt} index: the least an ordered
// relay must do, which the worker is set against. rawDBUnsortedFig reads
// any NEW events, in whatever order the server gives them: what the
// database can do for a relay that keeps no order.
var (
	insertFig        = figure[Rate]{"backlogInsert"}
	rawDBFig         = figure[Rate]{"rawDatabaseLoop"}
	rawDBUnsortedFig = figure[Rate]{"rawDatabaseLoopUnsorted"}
)

var rawDBStage = stage{
	key: "raw-db", figures: []anyFigure{insertFig, rawDBFig, rawDBUnsortedFig},
	steps: one("raw database loops", (*bench).rawDB),
	rows: func(r *Results, add addRow) {
		rateRow(rawDBFig, "events", func(r *Results) string {
			return fmt.Sprintf("Raw database limit (own loop: find %d NEW ids by createdAt, claim UpdateMany, mark UpdateMany)", r.Config.BatchSize)
		})(r, add)
		rateRow(rawDBUnsortedFig, "events", func(r *Results) string {
			return fmt.Sprintf("Raw database loop, unsorted (find %d NEW ids in no order, claim UpdateMany, mark UpdateMany)", r.Config.BatchSize)
		})(r, add)
	},
}

// rawDB measures the database's limit for the relay's access pattern with
// the harness's own loops, no broker: find the ids of a batch of NEW
// events, claim them with one UpdateMany, mark them PUBLISHED with
// another, until the backlog is gone. The sorted loop finds the oldest
// batch through the {status, createdAt} index; the unsorted one any
// batch. Each runs on a backlog of its own, the size of each worker
// run's.
func (b *bench) rawDB(ctx context.Context) error {
	readings := &tableReadings{b: b}
	defer readings.drop()
	loops := []struct {
		sorted     bool
		collection string
		fig        figure[Rate]
	}{
		{true, "raw_loop_sorted", rawDBFig},
		{false, "raw_loop_unsorted", rawDBUnsortedFig},
	}
	for _, loop := range loops {
		sorted := loop.sorted
		coll, _, err := b.preparedCollection(ctx, loop.collection)
		if err != nil {
			return err
		}
		t0 := time.Now()
		if _, err := insertEvents(ctx, coll, b.cfg.Backlog, 0, eventDoc); err != nil {
			dropQuietly(coll)
			return err
		}
		insert := time.Since(t0)
		if sorted {
			fmt.Fprintf(b.out, "   inserted %d NEW events in %.1fs (%.0f/s)\n", b.cfg.Backlog, insert.Seconds(), float64(b.cfg.Backlog)/insert.Seconds())
			insertFig.set(b.res, rateOf(b.cfg.Backlog, insert))
		}
		read, err := rawReadOf(ctx, coll, sorted)
		if err != nil {
			dropQuietly(coll)
			return err
		}
		tr := readings.start(ctx, coll, "raw-db", read.String(), b.cfg.Backlog)
		relayed, batches, elapsed, err := rawLoop(ctx, coll, b.cfg.BatchSize, read)
		if err != nil {
			return err
		}
		if relayed != b.cfg.Backlog {
			return fmt.Errorf("%s relayed %d events of %d", read, relayed, b.cfg.Backlog)
		}
		tr.end(relayed, batches)
		rate := rateOf(relayed, elapsed)
		loop.fig.set(b.res, rate)
		fmt.Fprintf(b.out, "   %s, find %d + claim + mark, %d batches: %d events in %.1fs: %.0f/s\n",
			read, b.cfg.BatchSize, batches, relayed, elapsed.Seconds(), rate.PerSecond)
	}
	return readings.finish(ctx)
}

// rawRead is how a raw loop finds its batch: the oldest NEW events
// through the index named (sorted), or any NEW events (index empty).
type rawRead struct{ index string }

func (r rawRead) String() string {
	if r.index == "" {
		return "unsorted raw loop"
	}
	return "sorted raw loop (index " + r.index + ")"
}

// rawReadOf is the sorted loop's read on coll, through the worker's
// {status, createdAt} index, or the unsorted loop's.
func rawReadOf(ctx context.Context, coll *driver.Collection, sorted bool) (rawRead, error) {
	if !sorted {
		return rawRead{}, nil
	}
	ix, err := statusCreatedAtIndex(ctx, coll)
	return rawRead{index: ix}, err
}

// statusCreatedAtIndex returns the name of coll's index on exactly
// {status: 1, createdAt: 1}, which mongo.Store.Prepare creates (the
// sampler's oldest NEW event reads through it), so that the sorted loop
// reads through the worker's own index whatever it is called.
func statusCreatedAtIndex(ctx context.Context, coll *driver.Collection) (string, error) {
	specs, err := coll.Indexes().ListSpecifications(ctx)
	if err != nil {
		return "", fmt.Errorf("list the indexes of %s: %w", coll.Name(), err)
	}
	want := bson.D{{Key: events.FieldStatus, Value: int32(1)}, {Key: events.FieldCreatedAt, Value: int32(1)}}
	for _, s := range specs {
		var keys bson.D
		if err := bson.Unmarshal(s.KeysDocument, &keys); err == nil && sameKeys(keys, want) {
			return s.Name, nil
		}
	}
	return "", fmt.Errorf("the worker made no {%s: 1, %s: 1} index on %s, which the sorted raw loop reads through", events.FieldStatus, events.FieldCreatedAt, coll.Name())
}

// sameKeys reports whether an index's keys are want's, in order, each
// ascending (1 of any numeric type).
func sameKeys(keys, want bson.D) bool {
	if len(keys) != len(want) {
		return false
	}
	for i := range keys {
		if keys[i].Key != want[i].Key || fmt.Sprint(keys[i].Value) != "1" {
			return false
		}
	}
	return true
}

// rawLoop runs rawBatch on coll until no NEW event is left and returns
// how many events it relayed, in how many batches, and how long it took.
func rawLoop(ctx context.Context, coll *driver.Collection, size int, read rawRead) (relayed, batches int, elapsed time.Duration, err error) {
	start := time.Now()
	for {
		n, err := rawBatch(ctx, coll, size, batches, read)
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
func rawBatch(ctx context.Context, coll *driver.Collection, size, seq int, read rawRead) (int, error) {
	opts := options.Find().
		SetProjection(bson.D{{Key: events.FieldID, Value: 1}}).
		SetLimit(int64(size)).
		SetBatchSize(int32(size))
	if read.index != "" {
		opts.SetSort(bson.D{{Key: events.FieldCreatedAt, Value: 1}}).SetHint(read.index)
	}
	cur, err := coll.Find(ctx, bson.D{{Key: events.FieldStatus, Value: events.StatusNew}}, opts)
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
