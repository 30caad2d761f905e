package mongo

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
)

// Claim claims up to limit NEW events whose retry time has come, oldest
// first, for lease. It costs two commands when no other worker races it
// (find, then one UpdateMany guarded by status NEW) and one more when one
// does: then it reads back exactly what this lease won.
//
// full reports that a whole batch was claimable when Claim looked, so more
// may be waiting: true even when other workers won part of it, so that the
// loser of a race claims again at once instead of idling until its next
// tick while a backlog remains.
func (s *Store) Claim(ctx context.Context, lease events.Lease, limit int) (claimed []events.Claimed, full bool, err error) {
	docs, err := s.findClaimable(ctx, lease.At, limit)
	if err != nil || len(docs) == 0 {
		return nil, false, err
	}
	full = len(docs) == limit
	ids := make([]any, len(docs))
	for i, d := range docs {
		ids[i] = d.ID
	}
	filter := bson.D{
		{Key: events.FieldStatus, Value: events.StatusNew},
		{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: ids}}},
	}
	update := bson.D{
		{Key: "$set", Value: bson.D{
			{Key: events.FieldStatus, Value: events.StatusProcessing},
			{Key: events.FieldWorkerID, Value: lease.WorkerID},
			{Key: events.FieldProcessingAt, Value: lease.At},
			{Key: events.FieldClaimToken, Value: lease.Token},
		}},
		{Key: "$inc", Value: bson.D{{Key: events.FieldAttempts, Value: 1}}},
		{Key: "$unset", Value: bson.D{{Key: events.FieldRetryAt, Value: ""}}},
	}
	res, err := s.coll.UpdateMany(ctx, filter, update)
	if err != nil {
		return nil, false, fmt.Errorf("claim %d events: %w", len(ids), err)
	}
	if int(res.ModifiedCount) == len(docs) {
		// We won every document we read, so what we read is what we hold.
		for i := range docs {
			docs[i].Attempts++
		}
		return docs, full, nil
	}
	// Another worker claimed some of them between our find and our update.
	claimed, err = s.findLeased(ctx, lease, len(docs))
	return claimed, full, err
}

func (s *Store) findClaimable(ctx context.Context, now time.Time, limit int) ([]events.Claimed, error) {
	filter := bson.D{
		{Key: events.FieldStatus, Value: events.StatusNew},
		// Events waiting for a retry are skipped, never in the way of newer ones.
		{Key: events.FieldRetryAt, Value: bson.D{{Key: "$not", Value: bson.D{{Key: "$gt", Value: now}}}}},
	}
	opts := options.Find().
		SetSort(bson.D{{Key: events.FieldCreatedAt, Value: 1}}).
		SetLimit(int64(limit)).
		SetBatchSize(oneBatch(limit))
	return s.findClaimed(ctx, filter, opts)
}

func (s *Store) findLeased(ctx context.Context, lease events.Lease, limit int) ([]events.Claimed, error) {
	filter := bson.D{
		{Key: events.FieldStatus, Value: events.StatusProcessing},
		{Key: events.FieldClaimToken, Value: lease.Token},
		{Key: events.FieldWorkerID, Value: lease.WorkerID},
	}
	opts := options.Find().SetBatchSize(oneBatch(limit))
	return s.findClaimed(ctx, filter, opts)
}

// oneBatch is the batch size that returns up to limit documents in the
// find's reply alone: one more than the limit, because a server whose
// first batch comes back exactly full may keep the cursor open (FerretDB
// does), and the driver then spends a getMore round trip to learn that
// nothing follows.
func oneBatch(limit int) int32 {
	return int32(min(limit+1, 1<<20))
}

func (s *Store) findClaimed(ctx context.Context, filter bson.D, opts *options.FindOptionsBuilder) ([]events.Claimed, error) {
	cur, err := s.coll.Find(ctx, filter, opts)
	if err != nil {
		return nil, fmt.Errorf("find events to claim: %w", err)
	}
	defer cur.Close(ctx)
	var out []events.Claimed
	for cur.Next(ctx) {
		doc := make(bson.Raw, len(cur.Current))
		copy(doc, cur.Current)
		out = append(out, claimed(doc))
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("read events to claim: %w", err)
	}
	return out, nil
}

func claimed(doc bson.Raw) events.Claimed {
	c := events.Claimed{Doc: doc}
	if v, err := doc.LookupErr(events.FieldID); err == nil {
		c.ID = rawID(v)
	}
	if v, err := doc.LookupErr(events.FieldAttempts); err == nil {
		if n, ok := v.AsInt64OK(); ok {
			c.Attempts = int(n)
		}
	}
	return c
}

// rawID turns a stored _id into a value a filter can match it with.
func rawID(v bson.RawValue) any {
	switch v.Type {
	case bson.TypeObjectID:
		return v.ObjectID()
	case bson.TypeString:
		return v.StringValue()
	default:
		return v // any other _id type still matches itself
	}
}

// MarkPublished marks the given events PUBLISHED if lease still holds them,
// inside a transaction where the deployment has them. It returns how many
// it marked; fewer than len(ids) means the rest were lost to recovery.
func (s *Store) MarkPublished(ctx context.Context, lease events.Lease, ids []any, at time.Time) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	update := bson.D{
		{Key: "$set", Value: bson.D{
			{Key: events.FieldStatus, Value: events.StatusPublished},
			{Key: events.FieldPublishedAt, Value: at},
		}},
	}
	var res *mongo.UpdateResult
	err := s.inTransaction(ctx, func(ctx context.Context) error {
		var err error
		res, err = s.coll.UpdateMany(ctx, leaseFilter(lease, ids), update)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("mark %d events published: %w", len(ids), err)
	}
	return int(res.ModifiedCount), nil
}

// Release moves the given events out of PROCESSING as r says, if lease
// still holds them, and returns how many it moved.
func (s *Store) Release(ctx context.Context, lease events.Lease, r events.Release) (int, error) {
	if len(r.IDs) == 0 {
		return 0, nil
	}
	set := bson.D{
		{Key: events.FieldStatus, Value: r.Status},
		{Key: events.FieldLastError, Value: r.LastError},
	}
	unset := bson.D{{Key: events.FieldClaimToken, Value: ""}}
	switch r.Status {
	case events.StatusNew:
		unset = append(unset,
			bson.E{Key: events.FieldWorkerID, Value: ""},
			bson.E{Key: events.FieldProcessingAt, Value: ""})
		if !r.RetryAt.IsZero() {
			set = append(set, bson.E{Key: events.FieldRetryAt, Value: r.RetryAt})
		}
	case events.StatusFailed:
		set = append(set, bson.E{Key: events.FieldFailedAt, Value: lease.At})
	default:
		return 0, fmt.Errorf("release to %s: only NEW or FAILED", r.Status)
	}
	update := bson.D{{Key: "$set", Value: set}, {Key: "$unset", Value: unset}}
	if r.Refund {
		update = append(update, bson.E{Key: "$inc", Value: bson.D{{Key: events.FieldAttempts, Value: -1}}})
	}
	res, err := s.coll.UpdateMany(ctx, leaseFilter(lease, r.IDs), update)
	if err != nil {
		return 0, fmt.Errorf("release %d events to %s: %w", len(r.IDs), r.Status, err)
	}
	return int(res.ModifiedCount), nil
}

// inTransaction runs fn in a transaction where the deployment supports
// them, and as it is where it does not.
func (s *Store) inTransaction(ctx context.Context, fn func(ctx context.Context) error) error {
	if !s.txn {
		return fn(ctx)
	}
	sess, err := s.client.StartSession()
	if err != nil {
		return fmt.Errorf("start session: %w", err)
	}
	defer sess.EndSession(ctx)
	_, err = sess.WithTransaction(ctx, func(ctx context.Context) (any, error) {
		return nil, fn(ctx)
	}, s.txnOpts)
	return err
}
