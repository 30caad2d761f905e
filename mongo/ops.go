package mongo

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
)

// RecoverStale resets events that have been PROCESSING since before
// staleBefore: back to NEW, or to FAILED once they have used maxAttempts
// claims (an event that keeps killing its workers must not loop forever).
// Any replica may run it at any time: each reset is one guarded write.
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
	return int(res.ModifiedCount), failed, nil
}

// DeletePublished deletes up to limit events PUBLISHED before the given
// time and returns how many. Callers loop to delete more, so a large
// backlog of history never holds the database for long.
//
// It costs two commands: a find of up to limit ids, then one delete of
// exactly those. The delete's filter puts status equality first (the part
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
	opts := options.Find().
		SetProjection(bson.D{{Key: events.FieldID, Value: 1}, {Key: events.FieldPublishedAt, Value: 1}}).
		SetLimit(int64(limit)).
		SetBatchSize(oneBatch(limit))
	cur, err := s.coll.Find(ctx, filter, opts)
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

// Stats is a snapshot of the outbox for operators.
type Stats struct {
	// Counts holds the number of events in each status; PUBLISHED is
	// estimated (see Store.Stats).
	Counts map[events.Status]int64 `json:"counts"`
	// OldestNew is the createdAt of the oldest NEW event; zero when none.
	OldestNew time.Time `json:"oldestNew,omitzero"`
	// Stale counts PROCESSING events claimed before the stale threshold.
	Stale int64 `json:"staleProcessing"`
}

// OldestNewAge is how long the oldest NEW event has waited at now; now
// should be the database server's time (Clock.Now).
//
// It is never negative. createdAt is written by the producer's clock, and
// even measured against the server's time an event can look younger than
// now: a producer whose clock runs ahead, or the offset's own uncertainty.
// An event cannot have waited less than no time, and a negative age would
// read on a dashboard or in an alert's arithmetic as a backlog that is
// ahead of schedule; so it is clamped at 0.
func (st Stats) OldestNewAge(now time.Time) time.Duration {
	if st.OldestNew.IsZero() {
		return 0
	}
	return max(now.Sub(st.OldestNew), 0)
}

// Stats counts events by status, finds the oldest NEW event and counts
// PROCESSING events claimed before staleBefore. Each query is an equality
// on status, so none of them reads published history: the PUBLISHED count
// is the collection's size from its metadata (estimatedDocumentCount) less
// the other statuses, because counting a week of history exactly would walk
// every one of its index keys, on every replica, at every sample.
func (s *Store) Stats(ctx context.Context, staleBefore time.Time) (Stats, error) {
	st := Stats{Counts: make(map[events.Status]int64, len(events.Statuses))}
	var unpublished int64
	for _, status := range events.Statuses {
		if status == events.StatusPublished {
			continue
		}
		n, err := s.coll.CountDocuments(ctx, bson.D{{Key: events.FieldStatus, Value: status}})
		if err != nil {
			return Stats{}, fmt.Errorf("count %s events: %w", status, err)
		}
		st.Counts[status] = n
		unpublished += n
	}
	total, err := s.coll.EstimatedDocumentCount(ctx)
	if err != nil {
		return Stats{}, fmt.Errorf("estimate the outbox's size: %w", err)
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
		return Stats{}, fmt.Errorf("find oldest NEW event: %w", err)
	}
	st.Stale, err = s.coll.CountDocuments(ctx, bson.D{
		{Key: events.FieldStatus, Value: events.StatusProcessing},
		{Key: events.FieldProcessingAt, Value: bson.D{{Key: "$lt", Value: staleBefore}}},
	})
	if err != nil {
		return Stats{}, fmt.Errorf("count stale events: %w", err)
	}
	return st, nil
}

// RequeueFilter chooses FAILED events to move back to NEW. At least one of
// its fields must be set; All chooses every FAILED event.
type RequeueFilter struct {
	IDs  []string
	Type string
	All  bool
}

func (f RequeueFilter) query() (bson.D, error) {
	q := bson.D{{Key: events.FieldStatus, Value: events.StatusFailed}}
	if len(f.IDs) == 0 && f.Type == "" && !f.All {
		return nil, fmt.Errorf("requeue needs --id, --type or --all")
	}
	if len(f.IDs) > 0 {
		q = append(q, bson.E{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: idCandidates(f.IDs)}}})
	}
	if f.Type != "" {
		q = append(q, bson.E{Key: events.FieldType, Value: f.Type})
	}
	return q, nil
}

// idCandidates matches an id given on a command line whether the event
// stored it as an ObjectID or as a string.
func idCandidates(ids []string) []any {
	out := make([]any, 0, 2*len(ids))
	for _, id := range ids {
		out = append(out, id)
		if oid, err := bson.ObjectIDFromHex(id); err == nil {
			out = append(out, oid)
		}
	}
	return out
}

// Requeue moves the FAILED events f chooses back to NEW with a fresh set of
// attempts, keeping lastError for the record. With dryRun it only counts
// them.
func (s *Store) Requeue(ctx context.Context, f RequeueFilter, dryRun bool) (int, error) {
	q, err := f.query()
	if err != nil {
		return 0, err
	}
	if dryRun {
		n, err := s.coll.CountDocuments(ctx, q)
		if err != nil {
			return 0, fmt.Errorf("count events to requeue: %w", err)
		}
		return int(n), nil
	}
	update := bson.D{
		{Key: "$set", Value: bson.D{
			{Key: events.FieldStatus, Value: events.StatusNew},
			{Key: events.FieldAttempts, Value: 0},
		}},
		{Key: "$unset", Value: bson.D{
			{Key: events.FieldWorkerID, Value: ""},
			{Key: events.FieldProcessingAt, Value: ""},
			{Key: events.FieldClaimToken, Value: ""},
			{Key: events.FieldRetryAt, Value: ""},
			{Key: events.FieldFailedAt, Value: ""},
			// A requeued event is no longer skipped: it holds its
			// aggregate again until it is published.
			{Key: events.FieldSkippedBy, Value: ""},
			{Key: events.FieldSkippedAt, Value: ""},
			{Key: events.FieldSkipReason, Value: ""},
		}},
	}
	res, err := s.coll.UpdateMany(ctx, q, update)
	if err != nil {
		return 0, fmt.Errorf("requeue events: %w", err)
	}
	return int(res.ModifiedCount), nil
}

// Find returns the event whose _id is id (as a string or an ObjectID's hex).
func (s *Store) Find(ctx context.Context, id string) (bson.Raw, error) {
	raw, err := s.coll.FindOne(ctx, bson.D{
		{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: idCandidates([]string{id})}}},
	}).Raw()
	if isNoDocuments(err) {
		return nil, fmt.Errorf("no event with _id %q", id)
	}
	if err != nil {
		return nil, fmt.Errorf("find event %q: %w", id, err)
	}
	return raw, nil
}
