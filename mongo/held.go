package mongo

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
)

// HeldStats is what operators see of held aggregates.
type HeldStats struct {
	// Aggregates counts the aggregates with NEW events waiting behind an
	// event that is backing off before a retry, or FAILED and not skipped
	// (where FAILED holds). An event in flight (PROCESSING) holds its
	// aggregate for a batch's time only and is not counted.
	Aggregates int64 `json:"heldAggregates"`
	// OldestWaiting is the createdAt of the oldest NEW event waiting
	// behind one of them; zero when none.
	OldestWaiting time.Time `json:"oldestHeld,omitzero"`
}

// OldestAge is how long the oldest held event has waited at now.
func (h HeldStats) OldestAge(now time.Time) time.Duration {
	if h.OldestWaiting.IsZero() {
		return 0
	}
	return max(now.Sub(h.OldestWaiting), 0)
}

// Held reads the held aggregates at now: the keys of FAILED events not
// skipped (when failedHolds) and of NEW events backing off, then, only
// when there are any, the due NEW events of those keys. Every find is an
// equality on status and projects the key fields.
func (s *Store) Held(ctx context.Context, now time.Time, failedHolds bool) (HeldStats, error) {
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
			return HeldStats{}, err
		}
	}
	var st HeldStats
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
		return HeldStats{}, err
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

// Skip marks the FAILED events named by ids (string or ObjectID hex) as
// skipped by an operator: status stays FAILED, and skippedBy, skippedAt
// and skipReason record who, when and why, so that the later events of
// their aggregates flow. An event already skipped keeps its first record.
// With dryRun it only counts them. Only FAILED events can be skipped.
func (s *Store) Skip(ctx context.Context, ids []string, by, reason string, at time.Time, dryRun bool) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	filter := bson.D{
		{Key: events.FieldStatus, Value: events.StatusFailed},
		{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: idCandidates(ids)}}},
		{Key: events.FieldSkippedAt, Value: bson.D{{Key: "$exists", Value: false}}},
	}
	if dryRun {
		n, err := s.coll.CountDocuments(ctx, filter)
		if err != nil {
			return 0, fmt.Errorf("count events to skip: %w", err)
		}
		return int(n), nil
	}
	res, err := s.coll.UpdateMany(ctx, filter, bson.D{{Key: "$set", Value: bson.D{
		{Key: events.FieldSkippedBy, Value: by},
		{Key: events.FieldSkippedAt, Value: at.UTC().Truncate(time.Millisecond)},
		{Key: events.FieldSkipReason, Value: truncateError(reason)},
	}}})
	if err != nil {
		return 0, fmt.Errorf("skip events: %w", err)
	}
	return int(res.ModifiedCount), nil
}
