package mongo

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
)

// PublishChartFerretMax is the largest outbox, in events, whose publish
// chart PublishedPerMinute draws on FerretDB.
const PublishChartFerretMax = 50000

// ErrNoPublishChart is PublishedPerMinute's error where counting the
// last hour's publishes would read every PUBLISHED event: on FerretDB
// past PublishChartFerretMax events.
var ErrNoPublishChart = errors.New("the publish chart is not drawn on FerretDB with a large outbox: it would read every PUBLISHED event")

// PublishedPerMinute counts the events published in each minute from
// since to now, oldest first: one entry per minute, zero where none was.
// On MongoDB the server groups the range of {status, publishedAt} by
// minute ($dateTrunc, MongoDB 5.0 and later), which reads index keys
// only; FerretDB has no $dateTrunc, so there the publish times of the
// range are read and counted here.
func (s *Store) PublishedPerMinute(ctx context.Context, since, now time.Time) ([]int64, error) {
	if s.ferret {
		// FerretDB would decode every PUBLISHED event, history and all,
		// at each view and each refresh of the overview.
		n, err := s.chartSize.estimate(ctx, now, s.estimatedCount)
		if err != nil {
			return nil, fmt.Errorf("count the events published per minute: %w", err)
		}
		if n > s.chartMax {
			return nil, fmt.Errorf("%w: the outbox holds about %d events, past %d", ErrNoPublishChart, n, s.chartMax)
		}
	}
	since = since.Truncate(time.Minute)
	counts := make([]int64, int(now.Sub(since)/time.Minute)+1)
	match := bson.D{{Key: "$match", Value: bson.D{
		{Key: events.FieldStatus, Value: events.StatusPublished},
		{Key: events.FieldPublishedAt, Value: bson.D{{Key: "$gte", Value: since}}},
	}}}
	pipeline := bson.A{match, bson.D{{Key: "$group", Value: bson.D{
		{Key: "_id", Value: bson.D{{Key: "$dateTrunc", Value: bson.D{{Key: "date", Value: "$" + events.FieldPublishedAt}, {Key: "unit", Value: "minute"}}}}},
		{Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}},
	}}}}
	if s.ferret {
		pipeline = bson.A{match, bson.D{{Key: "$project", Value: bson.D{{Key: "_id", Value: 0}, {Key: events.FieldPublishedAt, Value: 1}}}}}
	}
	cmd := bson.D{{Key: "aggregate", Value: s.coll.Name()}, {Key: "pipeline", Value: pipeline}, {Key: "cursor", Value: bson.D{}}}
	if s.readConcern != "" {
		cmd = append(cmd, bson.E{Key: "readConcern", Value: bson.D{{Key: "level", Value: s.readConcern}}})
	}
	cur, err := s.coll.Database().RunCommandCursor(ctx, cmd)
	if err != nil {
		return nil, fmt.Errorf("count the events published per minute: %w", err)
	}
	defer closeCursor(ctx, cur)
	for cur.Next(ctx) {
		// A minute and its count, or on FerretDB one publish time.
		at, ok := cur.Current.Lookup("_id").TimeOK()
		if !ok {
			if at, ok = cur.Current.Lookup(events.FieldPublishedAt).TimeOK(); !ok {
				continue
			}
		}
		n := int64(1)
		if v, err := cur.Current.LookupErr("n"); err == nil {
			n, _ = v.AsInt64OK()
		}
		if i := int(at.Sub(since) / time.Minute); i >= 0 && i < len(counts) {
			counts[i] += n
		}
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("count the events published per minute: %w", err)
	}
	return counts, nil
}

// sizeCache keeps the outbox's estimated size for a minute: on FerretDB
// its collStats analyzes the table, which the overview's chart need not
// do at each refresh.
type sizeCache struct {
	mu sync.Mutex
	at time.Time
	n  int64
}

// sizeMaxAge is how long an estimate of the outbox's size is used.
const sizeMaxAge = time.Minute

// estimate is the size read within sizeMaxAge of now, or read now with
// read.
func (c *sizeCache) estimate(ctx context.Context, now time.Time, read func(context.Context) (int64, error)) (int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && now.Sub(c.at) < sizeMaxAge && now.After(c.at) {
		return c.n, nil
	}
	n, err := read(ctx)
	if err != nil {
		return 0, err
	}
	c.at, c.n = now, n
	return n, nil
}
