package mongo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
)

// findClaimable reads the claim's candidates: the NEW events of its lane
// whose retry time has come, oldest first (createdAt, then _id), up to
// limit's count and bytes. more reports that it stopped at a bound.
//
// The lane (readHead) is the owned partitions' events that are not
// parked: the database leaves the rest out, so that what stands ahead of
// a replica's own work (other replicas' events, paused types, aggregates
// held by FAILED events) never uses up its read (docs/design.md, The
// claim's lane). Events of paused types, and with limit.Ordered the
// events of aggregates a FAILED event or a parked event holds, are
// planned to be parked as the read meets them, and parked by the claimer
// under its hold (WriteParked): each is read once, not by every claim.
//
// With limit.Ordered the read first learns which aggregates are held
// (heldKeys: PROCESSING, FAILED and, on MongoDB, backing off), beside the
// paused types. An outbox with no NEW event in the owned partitions costs
// one find (noNew); where events wait parked, each claim also sees
// whether a resume or a requeue freed them.
func (s *Store) findClaimable(ctx context.Context, now time.Time, limit events.ClaimLimit) (docs []bson.Raw, more bool, err error) {
	// An idle outbox costs one find. While a backlog drains the probe
	// would only repeat the head's read, so it is left out.
	if !limit.Draining {
		if empty, err := s.noNew(ctx, limit.Owned); err != nil || empty {
			s.noteReplySizes(ctx, nil, err)
			return nil, false, err
		}
	}
	full, err := s.loadParked(ctx, limit.Owned, limit.Tenures, time.Now())
	if err != nil {
		s.noteReplySizes(ctx, nil, err)
		return nil, false, err
	}
	var misfiled []bson.Raw
	if full {
		if misfiled, err = s.lane.misfiled(ctx, s); err != nil {
			return nil, false, err
		}
	}
	if !limit.Ordered {
		docs, more, err = s.findUnordered(ctx, now, limit)
	} else if docs, more, err = s.findOrdered(ctx, now, limit); err == nil {
		// Where events carry their aggregate's version (sequence.go).
		docs, err = s.orderBySequence(ctx, now, limit, docs)
	}
	if err != nil {
		return nil, false, err
	}
	docs = append(misfiled, docs...)
	s.ahead.expect(len(docs))
	return docs, more, nil
}

// findOrdered is findClaimable with ordering.
func (s *Store) findOrdered(ctx context.Context, now time.Time, limit events.ClaimLimit) ([]bson.Raw, bool, error) {
	var paused map[string]bool
	var pausedErr error
	pausedRead := make(chan struct{})
	go func() {
		defer close(pausedRead)
		paused, pausedErr = s.pausedSet(ctx)
	}()
	held, failed, err := s.heldKeys(ctx, now, limit.FailedHolds, !s.lane.backoffInLane(), limit.Held)
	<-pausedRead
	if err := errors.Join(err, pausedErr); err != nil {
		return nil, false, err
	}
	s.unparkReleased(ctx, limit.Owned, paused, failed)
	q := headQuery{ordered: true, held: held, failed: failed, paused: paused, withBackoff: s.lane.backoffInLane()}
	return s.readLane(ctx, now, limit, q)
}

// findUnordered is findClaimable without ordering: the events of paused
// types are parked, and nothing else waits for them.
func (s *Store) findUnordered(ctx context.Context, now time.Time, limit events.ClaimLimit) ([]bson.Raw, bool, error) {
	paused, err := s.pausedSet(ctx)
	if err != nil {
		return nil, false, err
	}
	s.unparkReleased(ctx, limit.Owned, paused, nil)
	return s.readLane(ctx, now, limit, headQuery{paused: paused})
}

// readLane reads the head (readHead), then stores the partitions it
// found missing, and keeps what it found to park for WriteParked. Those
// writes only spare later reads: their failure is logged, and the claim
// goes on with what it read.
func (s *Store) readLane(ctx context.Context, now time.Time, limit events.ClaimLimit, q headQuery) ([]bson.Raw, bool, error) {
	h, ok := s.fromAhead(now, limit, q)
	if !ok {
		readAt := time.Now()
		var err error
		if h, err = s.readHead(ctx, now, limit, q); err != nil {
			s.ahead.drop()
			return nil, false, err
		}
		s.ahead.put(aheadPage{docs: h.ahead, held: h.held, readAt: readAt, ended: h.ended}, limit)
	}
	if err := h.parking.writeStamps(ctx, s); err != nil && ctx.Err() == nil {
		s.logger.Warn("could not store the partition of events the claim read; the next claim reads them again", "error", err)
	}
	s.unwritten.put(h.parking) // written under the claimer's hold: WriteParked
	return h.docs, h.more, nil
}

// noNew reports whether the owned partitions have no NEW event at all,
// parked, due or not: one find of one document, unsorted, so that
// FerretDB stops at the first it decodes.
func (s *Store) noNew(ctx context.Context, owned []bool) (bool, error) {
	filter := bson.D{{Key: events.FieldStatus, Value: events.StatusNew}}
	opts := options.Find().SetLimit(1).SetProjection(bson.D{{Key: events.FieldID, Value: 1}})
	if owned != nil {
		if in, ok := s.lane.inPartitions(ownedList(owned)); ok {
			filter = append(filter, in)
		}
	}
	cur, err := s.coll.Find(ctx, filter, opts)
	if err != nil {
		return false, fmt.Errorf("find events to claim: %w", err)
	}
	defer closeCursor(ctx, cur)
	found := cur.Next(ctx)
	if err := cur.Err(); err != nil {
		return false, fmt.Errorf("read events to claim: %w", err)
	}
	return !found, nil
}

// heldQuery is one of heldKeys' finds. failed marks the FAILED events.
type heldQuery struct {
	filter bson.D
	failed bool
}

// heldKeys reads the ordering keys held at now (events.Held) in up to
// three projected finds, each an equality on status: PROCESSING first,
// then FAILED (when failedHolds), then NEW events backing off (when
// backingOff; otherwise the head's read holds their keys). The order
// matters: an event another actor moves meanwhile (a late worker's
// release, recovery, an operator) moves from PROCESSING to NEW or FAILED,
// so one find or the next sees it, or it is PUBLISHED and holds nothing.
// failed are the keys FAILED events hold, whose waiting events the claim
// parks.
// heldBatch is the reply batch of the held reads: their documents are a
// few projected fields, and with several replicas the PROCESSING read
// returns every other replica's batch in flight; the default first batch
// (101) cost a getMore per hundred of them on every claim.
const heldBatch = 10000

func (s *Store) heldKeys(ctx context.Context, now time.Time, failedHolds, backingOff bool, also map[string]bool) (held, failed map[string]bool, err error) {
	held, failed = map[string]bool{}, map[string]bool{}
	s.skipped.holdKeys(held)
	for k := range also {
		held[k] = true
	}
	proj := options.Find().SetProjection(bson.D{
		{Key: events.FieldAggregateType, Value: 1}, {Key: events.FieldAggregateID, Value: 1},
		{Key: events.FieldStatus, Value: 1}, {Key: events.FieldRetryAt, Value: 1},
		{Key: events.FieldSkippedAt, Value: 1},
	}).SetBatchSize(heldBatch)
	queries := []heldQuery{{filter: bson.D{{Key: events.FieldStatus, Value: events.StatusProcessing}}}}
	if failedHolds {
		// Skipped events hold nothing: left out by the server where it
		// can. skipped's $ne is FerretDB's, which pushes it down to
		// PostgreSQL and decodes none of them; skippedAt's null, which it
		// matches in Go, is MongoDB's, and leaves out the events skipped
		// before skipped was written.
		queries = append(queries, heldQuery{filter: bson.D{
			{Key: events.FieldStatus, Value: events.StatusFailed},
			{Key: events.FieldSkipped, Value: bson.D{{Key: "$ne", Value: true}}},
			{Key: events.FieldSkippedAt, Value: nil},
		}, failed: true})
	}
	if backingOff {
		queries = append(queries, heldQuery{filter: bson.D{
			{Key: events.FieldStatus, Value: events.StatusNew},
			{Key: events.FieldRetryAt, Value: bson.D{{Key: "$gt", Value: now}}},
		}})
	}
	for _, q := range queries {
		if err := s.readHeld(ctx, q, proj, now, failedHolds, held, failed); err != nil {
			return nil, nil, err
		}
	}
	return held, failed, nil
}

// readHeld runs one of heldKeys' finds into held (and failed, for the
// FAILED events).
func (s *Store) readHeld(ctx context.Context, q heldQuery, proj *options.FindOptionsBuilder, now time.Time, failedHolds bool, held, failed map[string]bool) error {
	cur, err := s.coll.Find(ctx, q.filter, proj)
	if err != nil {
		return fmt.Errorf("find held aggregates: %w", err)
	}
	defer closeCursor(ctx, cur)
	for cur.Next(ctx) {
		doc := cur.Current
		key, ok := events.OrderingKey(doc)
		if !ok {
			continue
		}
		// The finds select by the rule; it is applied here too, so that
		// it is stated once (a skipped event holds nothing).
		status, _ := doc.Lookup(events.FieldStatus).StringValueOK()
		retryAt, _ := doc.Lookup(events.FieldRetryAt).TimeOK()
		_, err := doc.LookupErr(events.FieldSkippedAt)
		if !events.Held(events.Status(status), retryAt, err == nil, now, failedHolds) {
			continue
		}
		held[key] = true
		if q.failed {
			failed[key] = true
		}
	}
	if err := cur.Err(); err != nil {
		return fmt.Errorf("read held aggregates: %w", err)
	}
	return nil
}
