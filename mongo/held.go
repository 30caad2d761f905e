package mongo

import (
	"context"
	"fmt"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
)

// heldWindow bounds each of Held's reads: the holders of each kind, and
// the NEW events, oldest first, among which it looks for those waiting
// behind them. On MongoDB each read is an index range (see ensureIndexes)
// cut at heldWindow documents (one more, to tell that there are more), so
// a sample costs at most that many documents per read however long the
// backlog is: 10,000 projected documents are about a megabyte, one reply.
// On FerretDB, which reads every NEW event for any of them, the window is
// cut from one read of them all (newHeldInOnePass). Events waiting behind
// a held aggregate are the ones claims leave at the head, so the oldest
// window holds the oldest of them; past it the count is a lower bound
// (HeldStats.Capped).
const heldWindow = 10000

// Held reads the held aggregates at now: the keys of FAILED events not
// skipped (when failedHolds) and of NEW events backing off, then, only
// when there are any or a type is paused, the oldest NEW events, to find
// those of such keys that wait; there the first NEW event of a paused type
// of each key holds it too. On MongoDB each read is a find with an
// equality on status, projected to the key fields and bounded by
// heldWindow (newHeldByIndex); on FerretDB the NEW events are one read
// (newHeldInOnePass). Every read carries a server-side time limit from
// ctx's deadline (timedFind); the paused types are the claims' set
// (pausedSet), a find of their own small collection when it is older
// than PausedTypesMaxAge.
func (s *Store) Held(ctx context.Context, now time.Time, failedHolds bool) (events.HeldStats, error) {
	var st events.HeldStats
	holders := map[string]bool{}
	if failedHolds {
		q := failedHolderFind()
		q.projection, q.limit = heldProjection, s.heldWindow+1
		read, err := s.eachKey(ctx, q, func(key string, doc bson.Raw) {
			if _, err := doc.LookupErr(events.FieldSkippedAt); err != nil {
				holders[key] = true
			}
		})
		if err != nil {
			return events.HeldStats{}, err
		}
		st.Capped = read > s.heldWindow
	}
	readNew := s.newHeldByIndex
	if s.onePassStats {
		readNew = s.newHeldInOnePass
	}
	window, capped, err := readNew(ctx, now, holders)
	if err != nil {
		return events.HeldStats{}, err
	}
	st.Capped = st.Capped || capped
	// The claims' set (pausedSet): the count agrees with what they hold
	// back, and a busy replica reads it once for both.
	paused, err := s.pausedSet(ctx)
	if err != nil {
		return events.HeldStats{}, err
	}
	waiting := map[string]bool{}
	for _, doc := range window {
		key, ok := events.OrderingKey(doc)
		if !ok {
			continue
		}
		if !holders[key] {
			if paused[typeOf(doc)] {
				holders[key] = true // the first event of a paused type holds the rest
			}
			continue
		}
		if at, ok := doc.Lookup(events.FieldRetryAt).TimeOK(); ok && at.After(now) {
			continue // the holder itself
		}
		waiting[key] = true
		if at, ok := doc.Lookup(events.FieldCreatedAt).TimeOK(); ok && (st.OldestWaiting.IsZero() || at.Before(st.OldestWaiting)) {
			st.OldestWaiting = at
		}
	}
	st.Aggregates = int64(len(waiting))
	return st, nil
}

// heldProjection is what Held reads of an event: its key, type and the
// times that tell whether it holds or waits.
var heldProjection = bson.D{
	{Key: events.FieldAggregateType, Value: 1}, {Key: events.FieldAggregateID, Value: 1},
	{Key: events.FieldSkippedAt, Value: 1}, {Key: events.FieldRetryAt, Value: 1},
	{Key: events.FieldCreatedAt, Value: 1}, {Key: events.FieldType, Value: 1},
}

// newHeldByIndex adds the keys of the NEW events backing off at now to
// holders and returns the oldest NEW events, at most heldWindow, in
// order, and whether either read was cut: two index ranges (MongoDB).
func (s *Store) newHeldByIndex(ctx context.Context, now time.Time, holders map[string]bool) ([]bson.Raw, bool, error) {
	q := backingOffFind(now)
	q.projection, q.limit = heldProjection, s.heldWindow+1
	read, err := s.eachKey(ctx, q, func(key string, _ bson.Raw) { holders[key] = true })
	if err != nil {
		return nil, false, err
	}
	capped := read > s.heldWindow
	var window []bson.Raw
	read, err = s.eachKey(ctx, findCommand{
		filter:     bson.D{{Key: events.FieldStatus, Value: events.StatusNew}},
		sort:       bson.D{{Key: events.FieldCreatedAt, Value: 1}},
		projection: heldProjection, limit: s.heldWindow + 1, hint: newByAgeIndex,
	}, func(_ string, doc bson.Raw) { window = append(window, doc) })
	if err != nil {
		return nil, false, err
	}
	return window[:min(len(window), s.heldWindow)], capped || read > s.heldWindow, nil
}

// newHeldInOnePass is newHeldByIndex in one read of the NEW events,
// sorted here (FerretDB). FerretDB answers each of newHeldByIndex's finds
// by decoding every NEW event, and sorts in Go; this decodes them once.
// It knows every event backing off, where newHeldByIndex knows the first
// heldWindow.
func (s *Store) newHeldInOnePass(ctx context.Context, now time.Time, holders map[string]bool) ([]bson.Raw, bool, error) {
	var all []bson.Raw
	_, err := s.eachKey(ctx, findCommand{
		filter:     bson.D{{Key: events.FieldStatus, Value: events.StatusNew}},
		projection: heldProjection, batch: passBatch,
	}, func(key string, doc bson.Raw) {
		if at, ok := doc.Lookup(events.FieldRetryAt).TimeOK(); ok && at.After(now) {
			holders[key] = true
		}
		all = append(all, slices.Clone(doc))
	})
	if err != nil {
		return nil, false, err
	}
	slices.SortStableFunc(all, func(a, b bson.Raw) int {
		at, _ := a.Lookup(events.FieldCreatedAt).TimeOK()
		bt, _ := b.Lookup(events.FieldCreatedAt).TimeOK()
		return at.Compare(bt)
	})
	return all[:min(len(all), s.heldWindow)], len(all) > s.heldWindow, nil
}

// holderFinds are the finds of the events that hold their aggregates at
// now: FAILED and not skipped (where FAILED holds), and NEW backing off
// before a retry. Each is an equality on status and a range of an index.
func holderFinds(now time.Time, failedHolds bool) []findCommand {
	if failedHolds {
		return []findCommand{failedHolderFind(), backingOffFind(now)}
	}
	return []findCommand{backingOffFind(now)}
}

func failedHolderFind() findCommand {
	return findCommand{filter: bson.D{
		{Key: events.FieldStatus, Value: events.StatusFailed},
		{Key: events.FieldSkipped, Value: bson.D{{Key: "$ne", Value: true}}}, // pushed down by FerretDB (heldKeys)
		{Key: events.FieldSkippedAt, Value: nil},
	}}
}

func backingOffFind(now time.Time) findCommand {
	return findCommand{filter: bson.D{
		{Key: events.FieldStatus, Value: events.StatusNew},
		{Key: events.FieldRetryAt, Value: bson.D{{Key: "$gt", Value: now}}},
	}, hint: claimOrderIndex}
}

// eachKey calls fn with each ordered event the find returns and its key,
// and returns how many documents it read.
func (s *Store) eachKey(ctx context.Context, f findCommand, fn func(key string, doc bson.Raw)) (int, error) {
	cur, err := s.timedFind(ctx, f)
	if err != nil {
		return 0, fmt.Errorf("find held aggregates: %w", err)
	}
	defer closeCursor(ctx, cur)
	read := 0
	for cur.Next(ctx) {
		read++
		if key, ok := events.OrderingKey(cur.Current); ok {
			fn(key, cur.Current)
		}
	}
	if err := cur.Err(); err != nil {
		return read, fmt.Errorf("read held aggregates: %w", err)
	}
	return read, nil
}
