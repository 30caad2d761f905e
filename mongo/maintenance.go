package mongo

import (
	"context"
	"fmt"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/metrics"
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
		msg := fmt.Sprintf("claim went stale on its last attempt (%d of %d): its worker stopped or hung", maxAttempts, maxAttempts)
		attempt := events.AttemptError{At: now, Reason: metrics.ReasonStaleMaxAttempts, Error: msg}
		update := bson.D{
			{Key: "$set", Value: failedSet(msg, now, attempt)},
			{Key: "$unset", Value: bson.D{{Key: events.FieldClaimToken, Value: ""}}},
		}
		failed, err = s.perWorker(ctx, filter, update, wroteBy(events.StatusFailed, msg), attempt)
		if err != nil {
			return 0, failed, fmt.Errorf("fail stale events out of attempts: %w", err)
		}
	}
	const staleMsg = "claim went stale: its worker stopped or hung before publishing"
	reset, err = s.perWorker(ctx, stale(), toNew(staleMsg), wroteBy(events.StatusNew, staleMsg),
		events.AttemptError{At: now, Reason: metrics.ReasonStale, Error: staleMsg})
	if err != nil {
		return reset, failed, fmt.Errorf("reset stale events: %w", err)
	}
	unusable := bson.D{
		{Key: events.FieldStatus, Value: events.StatusProcessing},
		{Key: "$or", Value: bson.A{
			bson.D{{Key: events.FieldProcessingAt, Value: bson.D{{Key: "$not", Value: bson.D{{Key: "$type", Value: "date"}}}}}},
			bson.D{{Key: events.FieldProcessingAt, Value: bson.D{{Key: "$gt", Value: now.Add(now.Sub(staleBefore))}}}},
		}},
	}
	const unusableMsg = "claim reset: its processingAt was missing, not a date, or far in the future, so it could never go stale"
	n, err := s.perWorker(ctx, unusable, toNew(unusableMsg), wroteBy(events.StatusNew, unusableMsg),
		events.AttemptError{At: now, Reason: metrics.ReasonStale, Error: unusableMsg})
	if err != nil {
		return reset + n, failed, fmt.Errorf("reset claims without a usable processingAt: %w", err)
	}
	return reset + n, failed, nil
}

// toNew is the update of recovery's reset to NEW, saying why in lastError.
func toNew(lastError string) bson.D {
	return bson.D{
		{Key: "$set", Value: bson.D{
			{Key: events.FieldStatus, Value: events.StatusNew},
			{Key: events.FieldLastError, Value: lastError},
		}},
		{Key: "$unset", Value: bson.D{
			{Key: events.FieldWorkerID, Value: ""},
			{Key: events.FieldProcessingAt, Value: ""},
			{Key: events.FieldClaimToken, Value: ""},
		}},
	}
}

// wroteBy matches the events a reset wrote: their status and lastError,
// equalities that FerretDB pushes down to its backend.
func wroteBy(status events.Status, lastError string) bson.D {
	return bson.D{{Key: events.FieldStatus, Value: status}, {Key: events.FieldLastError, Value: lastError}}
}

// perWorker applies update, with attempt added to each event's history,
// to the events filter matches, and returns how many it changed; wrote
// matches them afterwards, for trimAttempts. It
// writes once for each worker whose claims they are, so that the attempt
// names the worker whose claim failed (an update cannot copy a field into
// another), then once more for any left: events without a worker id, or
// claims that went stale since the workers were listed. Recovery resets
// the claims of the few workers that stopped or hung, so this is a few
// writes, each bounded by the stale filter's index.
func (s *Store) perWorker(ctx context.Context, filter, update, wrote bson.D, attempt events.AttemptError) (int, error) {
	workers, err := s.timedDistinct(ctx, events.FieldWorkerID, filter)
	if err != nil {
		return 0, fmt.Errorf("list the workers of the claims: %w", err)
	}
	total := 0
	write := func(filter bson.D, workerID string) error {
		a := attempt
		a.WorkerID = workerID
		res, err := s.coll.UpdateMany(ctx, filter, withAttempt(update, &a))
		if err != nil {
			return err
		}
		total += int(res.ModifiedCount)
		return nil
	}
	for _, w := range workers {
		if id, ok := w.(string); ok {
			if err := write(append(slices.Clone(filter), bson.E{Key: events.FieldWorkerID, Value: id}), id); err != nil {
				return total, err
			}
		}
	}
	if err := write(filter, ""); err != nil {
		return total, err
	}
	if total > 0 {
		s.trimAttempts(ctx, wrote)
	}
	return total, nil
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
	closeCursor(ctx, cur)
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
