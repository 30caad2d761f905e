package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// ttlIndexName names the expiry index of both collections.
const ttlIndexName = "inbox_expiry"

// MongoDB's codes for an index that exists with other options.
const (
	codeIndexOptionsConflict  = 85
	codeIndexKeySpecsConflict = 86
)

// ensureExpiry creates a TTL index on each collection and reports whether
// the server honours it. A server that refuses the option (FerretDB v1
// says it is not implemented) or accepts it and drops it (checked by
// listing the index back) has no TTL: the cleanup job then expires records.
// An existing index with another expiry (Retention changed) is updated with
// collMod.
func (i *Inbox) ensureExpiry(ctx context.Context) (bool, error) {
	seconds := int32(min(i.cfg.Retention/time.Second, time.Duration(1<<31-1)))
	for _, c := range []struct {
		coll  *mongo.Collection
		field string
	}{{i.records, fieldProcessedAt}, {i.attempts, fieldUpdatedAt}} {
		_, err := c.coll.Indexes().CreateOne(ctx, mongo.IndexModel{
			Keys:    bson.D{{Key: c.field, Value: 1}},
			Options: options.Index().SetName(ttlIndexName).SetExpireAfterSeconds(seconds),
		})
		var se mongo.ServerError
		switch {
		case err == nil:
		case errors.As(err, &se) && (se.HasErrorCode(codeIndexOptionsConflict) || se.HasErrorCode(codeIndexKeySpecsConflict)):
			if err := collMod(ctx, c.coll, seconds); err != nil {
				return false, err
			}
		case errors.As(err, &se):
			i.logger.Debug("inbox: TTL index refused", "collection", c.coll.Name(), "error", err)
			return false, nil
		default:
			return false, fmt.Errorf("inbox: create TTL index on %s: %w", c.coll.Name(), err)
		}
		ok, err := hasTTL(ctx, c.coll, seconds)
		if err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

// collMod changes an existing TTL index's expiry.
func collMod(ctx context.Context, coll *mongo.Collection, seconds int32) error {
	err := coll.Database().RunCommand(ctx, bson.D{
		{Key: "collMod", Value: coll.Name()},
		{Key: "index", Value: bson.D{{Key: "name", Value: ttlIndexName}, {Key: "expireAfterSeconds", Value: seconds}}},
	}).Err()
	if err != nil {
		return fmt.Errorf("inbox: index %s on %s exists with other options; changing its expiry failed (drop it and restart): %w",
			ttlIndexName, coll.Name(), err)
	}
	return nil
}

// hasTTL reports whether the expiry index exists with the given expiry.
func hasTTL(ctx context.Context, coll *mongo.Collection, seconds int32) (bool, error) {
	cur, err := coll.Indexes().List(ctx)
	if err != nil {
		return false, fmt.Errorf("inbox: list indexes of %s: %w", coll.Name(), err)
	}
	var specs []bson.M
	if err := cur.All(ctx, &specs); err != nil {
		return false, fmt.Errorf("inbox: list indexes of %s: %w", coll.Name(), err)
	}
	for _, s := range specs {
		if s["name"] != ttlIndexName {
			continue
		}
		switch v := s["expireAfterSeconds"].(type) {
		case int32:
			return v == seconds, nil
		case int64:
			return v == int64(seconds), nil
		case float64:
			return v == float64(seconds), nil
		}
	}
	return false, nil
}

// cleanupLoop runs cleanupOnce every CleanupInterval until ctx ends.
func (i *Inbox) cleanupLoop(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(i.cfg.CleanupInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// A select picks at random among ready cases: a tick that is
		// ready when ctx ends must not start a run.
		if ctx.Err() != nil {
			return
		}
		if _, err := i.cleanupOnce(ctx); err != nil && ctx.Err() == nil {
			i.logger.Warn("inbox: cleanup of expired records failed; retrying next interval", "error", err)
		}
	}
}

// cleanupOnce deletes records and attempts documents older than Retention
// and returns how many records it deleted.
func (i *Inbox) cleanupOnce(ctx context.Context) (int64, error) {
	cutoff := i.now().UTC().Add(-i.cfg.Retention)
	res, err := i.records.DeleteMany(ctx, bson.D{{Key: fieldProcessedAt, Value: bson.D{{Key: "$lt", Value: cutoff}}}})
	if err != nil {
		return 0, fmt.Errorf("delete expired records: %w", err)
	}
	i.metrics.Expired(res.DeletedCount)
	if _, err := i.attempts.DeleteMany(ctx, bson.D{{Key: fieldUpdatedAt, Value: bson.D{{Key: "$lt", Value: cutoff}}}}); err != nil {
		return res.DeletedCount, fmt.Errorf("delete expired attempts: %w", err)
	}
	return res.DeletedCount, nil
}
