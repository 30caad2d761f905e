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

// findClaimable reads the claim's candidates: NEW events whose retry time
// has come, oldest first (createdAt, then _id), up to limit's count and
// bytes. more reports that it stopped at a bound.
//
// With limit.Owned it keeps only the events of those partitions, and with
// limit.Ordered only those whose ordering key is not held (heldKeys): the
// finds then read on past what they skip, in cursor batches of about the
// share of the head this worker owns, until the claim is full.
//
// On MongoDB it runs two finds on the index {status, retryAt, createdAt,
// _id}, merged by createdAt and _id: events never retried ({retryAt:
// null}, in index order, so it examines what it returns), and events with
// a retryAt that is not in the future (due retries, usually few, and a
// retryAt of the wrong type, which the claim then fails). Events backing
// off are outside both index ranges and never examined, however many sit
// at the head. A single find cannot do both: with retryAt as a range, the
// index no longer gives createdAt order and the server sorts every
// candidate. On FerretDB, which plans neither with an index and decodes
// every NEW event of each find, one find with the same result costs half
// as much.
func (s *Store) findClaimable(ctx context.Context, now time.Time, limit events.ClaimLimit) (docs []bson.Raw, more bool, err error) {
	if !limit.Ordered {
		return s.readHead(ctx, now, limit, nil, nil)
	}
	// An idle outbox costs one find: the held aggregates are read only
	// when the head has something this worker may claim. They must be
	// read before the head that is claimed from (see heldKeys).
	probe := limit
	probe.Events, probe.Bytes = 1, 0
	if docs, _, err := s.readHead(ctx, now, probe, nil, nil); err != nil || len(docs) == 0 {
		return nil, false, err
	}
	held, exclude, err := s.heldKeys(ctx, now, limit.FailedHolds)
	if err != nil {
		return nil, false, err
	}
	return s.readHead(ctx, now, limit, held, exclude)
}

// readHead reads NEW due events in claim order and keeps those of owned
// partitions whose key is not held, up to limit; see findClaimable.
func (s *Store) readHead(ctx context.Context, now time.Time, limit events.ClaimLimit, held map[string]bool, exclude bson.A) (docs []bson.Raw, more bool, err error) {
	defer func() { s.noteReplySizes(ctx, docs, err) }()
	owned := 0
	for _, o := range limit.Owned {
		if o {
			owned++
		}
	}
	if limit.Owned != nil && owned == 0 {
		return nil, false, nil
	}
	filtered := limit.Owned != nil || len(held) > 0
	skipped := s.skipped.list()
	filter := func(retryAt any) bson.D {
		f := bson.D{
			{Key: events.FieldStatus, Value: events.StatusNew},
			{Key: events.FieldRetryAt, Value: retryAt},
		}
		if len(skipped) > 0 {
			f = append(f, bson.E{Key: events.FieldID, Value: bson.D{{Key: "$nin", Value: skipped}}})
		}
		if len(exclude) > 0 {
			f = append(f, bson.E{Key: "$nor", Value: exclude})
		}
		return f
	}
	opts := options.Find().SetSort(bson.D{{Key: events.FieldCreatedAt, Value: 1}, {Key: events.FieldID, Value: 1}})
	if filtered {
		// Read past what is skipped, but only so far: twice the window in
		// which the owned share of the head should hold a batch, in one
		// reply. Reading on to the end instead made every idle tick of a
		// replica whose partitions were drained scan the other replicas'
		// whole backlog, a getMore per cursor batch (hundreds of commands
		// per 1,000 events with 2 and 4 replicas). Owned events further
		// down come into the window as the head moves; a dead replica's
		// events at the head hold it back only until its partitions are
		// taken over.
		window := limit.Events
		if owned > 0 {
			window = limit.Events * events.Partitions / owned
		}
		examine := min(max(2*window, 200), 1<<16)
		opts.SetLimit(int64(examine)).SetBatchSize(s.capBatch(oneBatch(examine)))
	} else {
		opts.SetLimit(int64(limit.Events)).SetBatchSize(s.findBatch(limit.Events))
	}
	notLater := bson.D{{Key: "$not", Value: bson.D{{Key: "$gt", Value: now}}}}
	var filters []bson.D
	if s.splitClaim {
		opts.SetHint(claimOrderIndex)
		filters = []bson.D{
			filter(nil),
			filter(append(bson.D{{Key: "$ne", Value: nil}}, notLater...)),
		}
	} else {
		filters = []bson.D{filter(notLater)}
	}
	var heads []*head
	defer func() {
		for _, h := range heads {
			h.cur.Close(ctx)
		}
	}()
	for _, f := range filters {
		cur, err := s.coll.Find(ctx, f, opts)
		if err != nil {
			return nil, false, fmt.Errorf("find events to claim: %w", err)
		}
		h := &head{cur: cur}
		heads = append(heads, h)
		if err := h.next(ctx); err != nil {
			return nil, false, err
		}
	}
	total := 0
	for {
		var first *head
		for _, h := range heads {
			if h.doc != nil && (first == nil || h.before(first)) {
				first = h
			}
		}
		if first == nil {
			return docs, false, nil
		}
		if keep(first.doc, limit.Owned, held) {
			if len(docs) > 0 && limit.Bytes > 0 && total+len(first.doc) > limit.Bytes {
				return docs, true, nil
			}
			docs = append(docs, first.doc)
			total += len(first.doc)
			if len(docs) >= limit.Events {
				return docs, true, nil
			}
		}
		if err := first.next(ctx); err != nil {
			return nil, false, err
		}
	}
}

// keep reports whether a claim may take doc: it is in an owned partition
// (any, when owned is nil) and its ordering key is not held.
func keep(doc bson.Raw, owned []bool, held map[string]bool) bool {
	if owned != nil {
		if p := events.Partition(doc); p >= len(owned) || !owned[p] {
			return false
		}
	}
	if len(held) > 0 {
		if key, ok := events.OrderingKey(doc); ok && held[key] {
			return false
		}
	}
	return true
}

// head is a find's cursor and the next document it gives.
type head struct {
	cur *mongo.Cursor
	doc bson.Raw // nil once the cursor is exhausted
}

func (h *head) next(ctx context.Context) error {
	if !h.cur.Next(ctx) {
		h.doc = nil
		if err := h.cur.Err(); err != nil {
			return fmt.Errorf("read events to claim: %w", err)
		}
		return nil
	}
	h.doc = make(bson.Raw, len(h.cur.Current))
	copy(h.doc, h.cur.Current)
	return nil
}

// before orders two finds' next documents as the claim sorts them
// (createdAt, then _id), to merge the finds.
func (h *head) before(o *head) bool { return events.CompareOrder(h.doc, o.doc) < 0 }

// excludeMax bounds the held keys a claim names in its filter ($nor);
// past it the rest are skipped as they are read.
const excludeMax = 256

// heldQuery is one of heldKeys' finds. long marks statuses that hold a
// key for long (FAILED, backing off).
type heldQuery struct {
	filter bson.D
	long   bool
}

// heldKeys reads the ordering keys held at now (events.Held) in up to
// three projected finds, each an equality on status: PROCESSING first,
// then FAILED (when failedHolds), then NEW events backing off. The order
// matters: an event another actor moves meanwhile (a late worker's
// release, recovery, an operator) moves from PROCESSING to NEW or FAILED,
// so one find or the next sees it, or it is PUBLISHED and holds nothing.
// exclude names keys held by FAILED or backing-off events, which hold for
// long and may have many NEW events waiting behind them, so that the
// claim's finds leave those out instead of reading them every time.
// heldBatch is the reply batch of the held reads: their documents are a
// few projected fields, and with several replicas the PROCESSING read
// returns every other replica's batch in flight; the default first batch
// (101) cost a getMore per hundred of them on every claim.
const heldBatch = 10000

func (s *Store) heldKeys(ctx context.Context, now time.Time, failedHolds bool) (held map[string]bool, exclude bson.A, err error) {
	held = map[string]bool{}
	proj := options.Find().SetProjection(bson.D{
		{Key: events.FieldAggregateType, Value: 1}, {Key: events.FieldAggregateID, Value: 1},
		{Key: events.FieldStatus, Value: 1}, {Key: events.FieldRetryAt, Value: 1},
		{Key: events.FieldSkippedAt, Value: 1},
	}).SetBatchSize(heldBatch)
	queries := []heldQuery{{filter: bson.D{{Key: events.FieldStatus, Value: events.StatusProcessing}}}}
	if failedHolds {
		// Skipped events hold nothing: left out by the server where it can.
		queries = append(queries, heldQuery{filter: bson.D{
			{Key: events.FieldStatus, Value: events.StatusFailed},
			{Key: events.FieldSkippedAt, Value: nil},
		}, long: true})
	}
	queries = append(queries, heldQuery{filter: bson.D{
		{Key: events.FieldStatus, Value: events.StatusNew},
		{Key: events.FieldRetryAt, Value: bson.D{{Key: "$gt", Value: now}}},
	}, long: true})
	for _, q := range queries {
		cur, err := s.coll.Find(ctx, q.filter, proj)
		if err != nil {
			return nil, nil, fmt.Errorf("find held aggregates: %w", err)
		}
		for cur.Next(ctx) {
			doc := cur.Current
			key, ok := events.OrderingKey(doc)
			if !ok || held[key] {
				continue
			}
			// The finds select by the rule; it is applied here too, so
			// that it is stated once (a skipped event holds nothing).
			status, _ := doc.Lookup(events.FieldStatus).StringValueOK()
			retryAt, _ := doc.Lookup(events.FieldRetryAt).TimeOK()
			_, err := doc.LookupErr(events.FieldSkippedAt)
			if !events.Held(events.Status(status), retryAt, err == nil, now, failedHolds) {
				continue
			}
			held[key] = true
			typ, isString := doc.Lookup(events.FieldAggregateType).StringValueOK()
			if q.long && isString && typ != "" && len(exclude) < excludeMax {
				exclude = append(exclude, bson.D{
					{Key: events.FieldAggregateType, Value: typ},
					{Key: events.FieldAggregateID, Value: doc.Lookup(events.FieldAggregateID).StringValue()},
				})
			}
		}
		err = cur.Err()
		_ = cur.Close(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("read held aggregates: %w", err)
		}
	}
	return held, exclude, nil
}
