package mongo

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
)

// The writes of the background jobs: recovery's stale reset and retention's
// delete of old history.

// RecoverStale resets events that have been PROCESSING since before
// staleBefore: back to NEW, or to FAILED once they have used maxAttempts
// claims (an event that keeps killing its workers must not loop forever).
//
// It also resets to NEW, whatever their attempts, PROCESSING events whose
// processingAt cannot say when they were claimed, which the stale test
// would never match: missing, null or not a date, or later than now by
// more than the stale threshold (now - staleBefore). A claim writes
// processingAt from the database's clock, so a healthy one is never that
// far ahead; such a value was written by hand or by a producer, or by a
// worker whose clock was wildly off, and waiting for it would hold the
// event (and its aggregate) for ever. A processingAt ahead by less than
// the threshold is left to the stale test, which it meets within twice
// the threshold.
//
// Any replica may run it at any time: each reset is one guarded write.
// Its updates are ranges of {status, processingAt} (the unusable ones read
// the PROCESSING events only), and carry a server-side time limit from
// ctx's deadline: what a write reset before the limit stays reset, the
// rest waits for the next run.
func (s *Store) RecoverStale(ctx context.Context, staleBefore, now time.Time, maxAttempts int) (reset, failed int, err error) {
	stale := func() bson.D {
		return bson.D{
			{Key: events.FieldStatus, Value: events.StatusProcessing},
			{Key: events.FieldProcessingAt, Value: bson.D{{Key: "$lt", Value: staleBefore}}},
		}
	}
	if maxAttempts > 0 {
		filter := append(stale(), bson.E{Key: events.FieldAttempts, Value: bson.D{{Key: "$gte", Value: maxAttempts}}})
		update := bson.D{
			{Key: "$set", Value: bson.D{
				{Key: events.FieldStatus, Value: events.StatusFailed},
				{Key: events.FieldFailedAt, Value: now},
				{Key: events.FieldLastError, Value: fmt.Sprintf("claim went stale on its last attempt (%d of %d): its worker stopped or hung", maxAttempts, maxAttempts)},
			}},
			{Key: "$unset", Value: bson.D{{Key: events.FieldClaimToken, Value: ""}}},
		}
		res, err := s.coll.UpdateMany(ctx, filter, update)
		if err != nil {
			return 0, 0, fmt.Errorf("fail stale events out of attempts: %w", err)
		}
		failed = int(res.ModifiedCount)
	}
	update := bson.D{
		{Key: "$set", Value: bson.D{
			{Key: events.FieldStatus, Value: events.StatusNew},
			{Key: events.FieldLastError, Value: "claim went stale: its worker stopped or hung before publishing"},
		}},
		{Key: "$unset", Value: bson.D{
			{Key: events.FieldWorkerID, Value: ""},
			{Key: events.FieldProcessingAt, Value: ""},
			{Key: events.FieldClaimToken, Value: ""},
		}},
	}
	res, err := s.coll.UpdateMany(ctx, stale(), update)
	if err != nil {
		return 0, failed, fmt.Errorf("reset stale events: %w", err)
	}
	reset = int(res.ModifiedCount)
	unusable := bson.D{
		{Key: events.FieldStatus, Value: events.StatusProcessing},
		{Key: "$or", Value: bson.A{
			bson.D{{Key: events.FieldProcessingAt, Value: bson.D{{Key: "$not", Value: bson.D{{Key: "$type", Value: "date"}}}}}},
			bson.D{{Key: events.FieldProcessingAt, Value: bson.D{{Key: "$gt", Value: now.Add(now.Sub(staleBefore))}}}},
		}},
	}
	update[0].Value = bson.D{
		{Key: events.FieldStatus, Value: events.StatusNew},
		{Key: events.FieldLastError, Value: "claim reset: its processingAt was missing, not a date, or far in the future, so it could never go stale"},
	}
	res, err = s.coll.UpdateMany(ctx, unusable, update)
	if err != nil {
		return reset, failed, fmt.Errorf("reset claims without a usable processingAt: %w", err)
	}
	return reset + int(res.ModifiedCount), failed, nil
}

// DeletePublished deletes up to limit events PUBLISHED before the given
// time and returns how many. Callers loop to delete more, so a large
// backlog of history never holds the database for long.
//
// It costs two commands: a find of up to limit ids on {status,
// publishedAt}, then one delete of exactly those. Both carry a server-side
// time limit from ctx's deadline (see timedFind). The delete's filter puts status equality first (the part
// FerretDB pushes down to its backend, and the prefix of outbox_retention
// on MongoDB), then publishedAt no later than the latest found: a server
// that evaluates the filter itself, as FerretDB does for every PUBLISHED
// event, rejects the younger history on one date comparison before it
// compares the _id against the batch's ids.
func (s *Store) DeletePublished(ctx context.Context, before time.Time, limit int) (int, error) {
	filter := bson.D{
		{Key: events.FieldStatus, Value: events.StatusPublished},
		{Key: events.FieldPublishedAt, Value: bson.D{{Key: "$lt", Value: before}}},
	}
	cur, err := s.timedFind(ctx, findCommand{
		filter:     filter,
		projection: bson.D{{Key: events.FieldID, Value: 1}, {Key: events.FieldPublishedAt, Value: 1}},
		limit:      limit,
		hint:       retentionIndex,
	})
	if err != nil {
		return 0, fmt.Errorf("find published events to delete: %w", err)
	}
	var (
		ids    []any
		latest time.Time
	)
	for cur.Next(ctx) {
		ids = append(ids, rawID(cur.Current.Lookup(events.FieldID)))
		if at, ok := cur.Current.Lookup(events.FieldPublishedAt).TimeOK(); ok && at.After(latest) {
			latest = at
		}
	}
	_ = cur.Close(ctx)
	if err := cur.Err(); err != nil || len(ids) == 0 {
		return 0, err
	}
	res, err := s.coll.DeleteMany(ctx, bson.D{
		{Key: events.FieldStatus, Value: events.StatusPublished},
		{Key: events.FieldPublishedAt, Value: bson.D{{Key: "$lte", Value: latest}}},
		{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: ids}}},
	})
	if err != nil {
		return 0, fmt.Errorf("delete %d published events: %w", len(ids), err)
	}
	return int(res.DeletedCount), nil
}
