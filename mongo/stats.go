package mongo

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
)

// Stats counts events by status (and those of no known status under
// events.StatusUnknown), finds the oldest NEW event and counts
// PROCESSING events claimed before staleBefore. None of its reads touches
// the published history: the PUBLISHED count is the collection's size
// from its metadata (estimatedCount) less the other statuses, because
// counting a week of history exactly would walk every one of its index
// keys, on every replica, at every sample. On MongoDB each figure is an
// index range (countByIndex); on FerretDB, which has no index to read,
// they come from one read of the backlog (countInOnePass). Every command
// carries a server-side time limit from ctx's deadline (see timedFind).
func (s *Store) Stats(ctx context.Context, staleBefore time.Time) (events.Stats, error) {
	count := s.countByIndex
	if s.onePassStats {
		count = s.countInOnePass
	}
	st, err := count(ctx, staleBefore)
	if err != nil {
		return events.Stats{}, err
	}
	var unpublished int64
	for _, n := range st.Counts {
		unpublished += n
	}
	total, err := s.estimatedCount(ctx)
	if err != nil {
		return events.Stats{}, fmt.Errorf("estimate the outbox's size: %w", err)
	}
	// The counts are taken one after the other while the relay runs, so
	// the difference can dip below zero for a moment.
	st.Counts[events.StatusPublished] = max(total-unpublished, 0)
	return st, nil
}

// countByIndex counts the events of each status but PUBLISHED, and of no
// known status, finds the oldest NEW event and counts the stale ones, a
// command each, each reading the keys of an index range (MongoDB).
func (s *Store) countByIndex(ctx context.Context, staleBefore time.Time) (events.Stats, error) {
	st := events.Stats{Counts: make(map[events.Status]int64, len(events.CountedStatuses))}
	for _, status := range events.Statuses {
		if status == events.StatusPublished {
			continue
		}
		n, err := s.coll.CountDocuments(ctx, bson.D{{Key: events.FieldStatus, Value: status}})
		if err != nil {
			return events.Stats{}, fmt.Errorf("count %s events: %w", status, err)
		}
		st.Counts[status] = n
	}
	// Events under no known status (a producer's "new", a number, none at
	// all) are never claimed: count them, rather than let the estimate
	// take them for PUBLISHED. The $nin is index bounds around the four
	// statuses (it reads the unknown keys only).
	unknown, err := s.coll.CountDocuments(ctx, bson.D{{Key: events.FieldStatus, Value: bson.D{
		{Key: "$ne", Value: events.StatusPublished},
		{Key: "$nin", Value: events.Statuses},
	}}}, options.Count().SetHint(newByAgeIndex))
	if err != nil {
		return events.Stats{}, fmt.Errorf("count events of unknown status: %w", err)
	}
	st.Counts[events.StatusUnknown] = unknown
	var oldest struct {
		CreatedAt time.Time `bson:"createdAt"`
	}
	err = s.coll.FindOne(ctx,
		bson.D{{Key: events.FieldStatus, Value: events.StatusNew}},
		options.FindOne().
			SetHint(newByAgeIndex).
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

// countInOnePass finds what countByIndex does in one read of the events
// not PUBLISHED (FerretDB). FerretDB answers each of countByIndex's
// commands by decoding every event its status equality matches (the $ne
// of the unknown count, every unpublished one), and sorts in Go: six
// decodings of the backlog, which behind a backlog of 20,000 on a busy
// host outlasted the sample's time limit every run. Its $ne is pushed down
// to PostgreSQL, so this reads the backlog once, and never the history.
func (s *Store) countInOnePass(ctx context.Context, staleBefore time.Time) (events.Stats, error) {
	st := events.Stats{Counts: make(map[events.Status]int64, len(events.CountedStatuses))}
	for _, status := range events.CountedStatuses {
		if status != events.StatusPublished {
			st.Counts[status] = 0
		}
	}
	cur, err := s.timedFind(ctx, findCommand{
		filter: bson.D{{Key: events.FieldStatus, Value: bson.D{{Key: "$ne", Value: events.StatusPublished}}}},
		projection: bson.D{
			{Key: events.FieldID, Value: 0}, {Key: events.FieldStatus, Value: 1},
			{Key: events.FieldCreatedAt, Value: 1}, {Key: events.FieldProcessingAt, Value: 1},
		},
		batch: passBatch,
	})
	if err != nil {
		return events.Stats{}, fmt.Errorf("count the events not published: %w", err)
	}
	defer closeCursor(ctx, cur)
	for cur.Next(ctx) {
		countEvent(&st, cur.Current, staleBefore)
	}
	if err := cur.Err(); err != nil {
		return events.Stats{}, fmt.Errorf("count the events not published: %w", err)
	}
	return st, nil
}

// passBatch is how many projected events (a few dozen bytes each) a
// reply of a one-pass read carries: all of them, in the find's own reply,
// so that the find's maxTimeMS bounds the whole pass. FerretDB applies
// maxTimeMS until the find's first reply only: a pass read in batches of
// 10,000 ran on in its getMores for minutes after the sampler had given
// up on it, beside the next sample's.
const passBatch = 1 << 20

// countEvent adds one event of countInOnePass's read to st, as
// countByIndex's commands would count it.
func countEvent(st *events.Stats, doc bson.Raw, staleBefore time.Time) {
	status, _ := doc.Lookup(events.FieldStatus).StringValueOK()
	switch events.Status(status) {
	case events.StatusNew:
		if at, ok := doc.Lookup(events.FieldCreatedAt).TimeOK(); ok && (st.OldestNew.IsZero() || at.Before(st.OldestNew)) {
			st.OldestNew = at
		}
	case events.StatusProcessing:
		if at, ok := doc.Lookup(events.FieldProcessingAt).TimeOK(); ok && at.Before(staleBefore) {
			st.Stale++
		}
	case events.StatusFailed:
	default:
		st.Counts[events.StatusUnknown]++
		return
	}
	st.Counts[events.Status(status)]++
}

// estimatedCount is the outbox's size from its metadata. FerretDB answers
// a count without a filter (what EstimatedDocumentCount sends) by decoding
// every document, the PUBLISHED history included, which on a busy host
// outlasted the sample's time limit every run; its collStats reads
// PostgreSQL's estimate of the table's rows instead.
func (s *Store) estimatedCount(ctx context.Context) (int64, error) {
	if !s.ferret {
		return s.coll.EstimatedDocumentCount(ctx)
	}
	res, err := s.coll.Database().RunCommand(ctx, bson.D{{Key: "collStats", Value: s.coll.Name()}}).Raw()
	if err != nil {
		return 0, err
	}
	v := res.Lookup("count")
	if n, ok := v.AsInt64OK(); ok {
		return n, nil
	}
	if f, ok := v.DoubleOK(); ok {
		return int64(f), nil
	}
	return 0, fmt.Errorf("collStats gave no count: %s", res)
}
