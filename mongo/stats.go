package mongo

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
)

// Stats counts events by status, finds the oldest NEW event and counts
// PROCESSING events claimed before staleBefore. Each query is an equality
// on status, so none of them reads published history: the PUBLISHED count
// is the collection's size from its metadata (estimatedDocumentCount) less
// the other statuses, because counting a week of history exactly would walk
// every one of its index keys, on every replica, at every sample.
func (s *Store) Stats(ctx context.Context, staleBefore time.Time) (events.Stats, error) {
	st := events.Stats{Counts: make(map[events.Status]int64, len(events.Statuses))}
	var unpublished int64
	for _, status := range events.Statuses {
		if status == events.StatusPublished {
			continue
		}
		n, err := s.coll.CountDocuments(ctx, bson.D{{Key: events.FieldStatus, Value: status}})
		if err != nil {
			return events.Stats{}, fmt.Errorf("count %s events: %w", status, err)
		}
		st.Counts[status] = n
		unpublished += n
	}
	total, err := s.coll.EstimatedDocumentCount(ctx)
	if err != nil {
		return events.Stats{}, fmt.Errorf("estimate the outbox's size: %w", err)
	}
	// The counts are taken one after the other while the relay runs, so
	// the difference can dip below zero for a moment.
	st.Counts[events.StatusPublished] = max(total-unpublished, 0)
	var oldest struct {
		CreatedAt time.Time `bson:"createdAt"`
	}
	err = s.coll.FindOne(ctx,
		bson.D{{Key: events.FieldStatus, Value: events.StatusNew}},
		options.FindOne().
			SetSort(bson.D{{Key: events.FieldCreatedAt, Value: 1}}).
			SetProjection(bson.D{{Key: events.FieldCreatedAt, Value: 1}}),
	).Decode(&oldest)
	switch {
	case err == nil:
		st.OldestNew = oldest.CreatedAt
	case !isNoDocuments(err):
		return events.Stats{}, fmt.Errorf("find oldest NEW event: %w", err)
	}
	st.Stale, err = s.coll.CountDocuments(ctx, bson.D{
		{Key: events.FieldStatus, Value: events.StatusProcessing},
		{Key: events.FieldProcessingAt, Value: bson.D{{Key: "$lt", Value: staleBefore}}},
	})
	if err != nil {
		return events.Stats{}, fmt.Errorf("count stale events: %w", err)
	}
	return st, nil
}

// Held reads the held aggregates at now: the keys of FAILED events not
// skipped (when failedHolds) and of NEW events backing off, then, only
// when there are any, the due NEW events of those keys. Every find is an
// equality on status and projects the key fields.
func (s *Store) Held(ctx context.Context, now time.Time, failedHolds bool) (events.HeldStats, error) {
	proj := options.Find().SetProjection(bson.D{
		{Key: events.FieldAggregateType, Value: 1}, {Key: events.FieldAggregateID, Value: 1},
		{Key: events.FieldSkippedAt, Value: 1}, {Key: events.FieldRetryAt, Value: 1},
		{Key: events.FieldCreatedAt, Value: 1},
	})
	holders := map[string]bool{}
	var queries []bson.D
	if failedHolds {
		queries = append(queries, bson.D{{Key: events.FieldStatus, Value: events.StatusFailed}, {Key: events.FieldSkippedAt, Value: nil}})
	}
	queries = append(queries, bson.D{
		{Key: events.FieldStatus, Value: events.StatusNew},
		{Key: events.FieldRetryAt, Value: bson.D{{Key: "$gt", Value: now}}},
	})
	for _, q := range queries {
		err := s.eachKey(ctx, q, proj, func(key string, doc bson.Raw) {
			if _, err := doc.LookupErr(events.FieldSkippedAt); err != nil {
				holders[key] = true
			}
		})
		if err != nil {
			return events.HeldStats{}, err
		}
	}
	var st events.HeldStats
	if len(holders) == 0 {
		return st, nil
	}
	waiting := map[string]bool{}
	err := s.eachKey(ctx, bson.D{{Key: events.FieldStatus, Value: events.StatusNew}}, proj, func(key string, doc bson.Raw) {
		if !holders[key] {
			return
		}
		if at, ok := doc.Lookup(events.FieldRetryAt).TimeOK(); ok && at.After(now) {
			return // the holder itself
		}
		waiting[key] = true
		if at, ok := doc.Lookup(events.FieldCreatedAt).TimeOK(); ok && (st.OldestWaiting.IsZero() || at.Before(st.OldestWaiting)) {
			st.OldestWaiting = at
		}
	})
	if err != nil {
		return events.HeldStats{}, err
	}
	st.Aggregates = int64(len(waiting))
	return st, nil
}

// eachKey calls fn with each ordered event filter matches and its key.
func (s *Store) eachKey(ctx context.Context, filter bson.D, opts *options.FindOptionsBuilder, fn func(key string, doc bson.Raw)) error {
	cur, err := s.coll.Find(ctx, filter, opts)
	if err != nil {
		return fmt.Errorf("find held aggregates: %w", err)
	}
	defer cur.Close(ctx)
	for cur.Next(ctx) {
		if key, ok := events.OrderingKey(cur.Current); ok {
			fn(key, cur.Current)
		}
	}
	if err := cur.Err(); err != nil {
		return fmt.Errorf("read held aggregates: %w", err)
	}
	return nil
}
