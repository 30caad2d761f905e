package mongo

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
)

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
		return 0, asTimeout(fmt.Errorf("mark %d events published: %w", len(ids), err))
	}
	return int(res.ModifiedCount), nil
}

// Abandon puts every event lease holds back to NEW with its attempt
// refunded, and returns how many it moved. It is for a claim whose write
// failed part-way (a timeout, a connection lost mid-reply): the server may
// have claimed some events for the lease before the error, and none of
// them was published, so they need not wait for recovery nor lose an
// attempt.
func (s *Store) Abandon(ctx context.Context, lease events.Lease) (int, error) {
	// Events back in NEW may sort before a read-ahead's (ahead.go).
	s.ahead.drop()
	filter := bson.D{
		{Key: events.FieldStatus, Value: events.StatusProcessing},
		{Key: events.FieldClaimToken, Value: lease.Token},
		{Key: events.FieldWorkerID, Value: lease.WorkerID},
	}
	res, err := s.coll.UpdateMany(ctx, filter, unclaimUpdate)
	if err != nil {
		return 0, fmt.Errorf("abandon the claim of lease %s: %w", lease.Token, err)
	}
	return int(res.ModifiedCount), nil
}

// unclaimUpdate puts claimed events back to NEW as if never claimed: the
// lease's fields go and the claim's attempt is refunded.
var unclaimUpdate = bson.D{
	{Key: "$set", Value: bson.D{{Key: events.FieldStatus, Value: events.StatusNew}}},
	{Key: "$unset", Value: bson.D{
		{Key: events.FieldClaimToken, Value: ""},
		{Key: events.FieldWorkerID, Value: ""},
		{Key: events.FieldProcessingAt, Value: ""},
	}},
	{Key: "$inc", Value: bson.D{{Key: events.FieldAttempts, Value: -1}}},
}

// Release moves the given events out of PROCESSING as r says, if lease
// still holds them, and returns how many it moved.
func (s *Store) Release(ctx context.Context, lease events.Lease, r events.Release) (int, error) {
	if len(r.IDs) == 0 {
		return 0, nil
	}
	// Events back in NEW may sort before a read-ahead's (ahead.go).
	s.ahead.drop()
	set := bson.D{
		{Key: events.FieldStatus, Value: r.Status},
		{Key: events.FieldLastError, Value: truncateError(r.LastError)},
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
		if r.Attempt != nil {
			set = append(set, failureFields(r.LastError, *r.Attempt)...)
		}
	default:
		return 0, fmt.Errorf("release to %s: only NEW or FAILED", r.Status)
	}
	update := bson.D{{Key: "$set", Value: set}, {Key: "$unset", Value: unset}}
	if r.Refund {
		update = append(update, bson.E{Key: "$inc", Value: bson.D{{Key: events.FieldAttempts, Value: -1}}})
	}
	res, err := s.coll.UpdateMany(ctx, leaseFilter(lease, r.IDs), withAttempt(update, r.Attempt))
	if err != nil {
		return 0, asTimeout(fmt.Errorf("release %d events to %s: %w", len(r.IDs), r.Status, err))
	}
	if r.Attempt != nil {
		s.trimAttempts(ctx, byIDs(r.IDs))
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
