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
// as much, and an ordered claim reads the events backing off in that same
// find rather than in one of their own.
func (s *Store) findClaimable(ctx context.Context, now time.Time, limit events.ClaimLimit) (docs []bson.Raw, more bool, err error) {
	if !limit.Ordered {
		h, err := s.readHead(ctx, now, limit, headQuery{})
		return h.docs, h.more, err
	}
	// An idle outbox costs one find: the held aggregates are read only
	// when the head has something this worker may claim. They must be
	// read before the head that is claimed from (see heldKeys). While a
	// backlog drains the probe would only repeat the head's read (on
	// FerretDB, a read of every NEW event), so it is left out.
	if !limit.Draining {
		probe := limit
		probe.Events, probe.Bytes = 1, 0
		if h, err := s.readHead(ctx, now, probe, headQuery{}); err != nil || len(h.docs) == 0 {
			return nil, false, err
		}
	}
	if !s.splitClaim {
		// FerretDB reads every NEW event for any find on them, so the
		// events backing off come with the head instead of in a find of
		// their own: one such read per claim, not two. Where they crowd
		// the window out, the claim reads as on MongoDB.
		held, exclude, err := s.heldKeys(ctx, now, limit.FailedHolds, false)
		if err != nil {
			return nil, false, err
		}
		h, err := s.readHead(ctx, now, limit, headQuery{held: held, exclude: exclude, withBackoff: true})
		if err != nil || !h.crowded {
			return h.docs, h.more, err
		}
	}
	held, exclude, err := s.heldKeys(ctx, now, limit.FailedHolds, true)
	if err != nil {
		return nil, false, err
	}
	h, err := s.readHead(ctx, now, limit, headQuery{held: held, exclude: exclude})
	return h.docs, h.more, err
}

// headQuery says which events of the head a claim leaves out.
type headQuery struct {
	// held are the ordering keys whose events are not claimed, and
	// exclude those of them the server leaves out ($nor).
	held    map[string]bool
	exclude bson.A
	// withBackoff reads the events backing off too, and holds their keys
	// as they come: an event sorts before every later event of its key,
	// so its hold is known before they are read. held is then written to.
	withBackoff bool
}

// head is what readHead read: the documents to claim, whether it stopped
// at a bound (more), and whether events backing off took up a window that
// ended before the batch was full (crowded: the claim may be missing
// events further down).
type head struct {
	docs    []bson.Raw
	more    bool
	crowded bool
}

// readHead reads NEW due events in claim order and keeps those of owned
// partitions whose key is not held, up to limit; see findClaimable.
func (s *Store) readHead(ctx context.Context, now time.Time, limit events.ClaimLimit, q headQuery) (h head, err error) {
	defer func() { s.noteReplySizes(ctx, h.docs, err) }()
	owned := 0
	for _, o := range limit.Owned {
		if o {
			owned++
		}
	}
	if limit.Owned != nil && owned == 0 {
		return head{}, nil
	}
	filtered := limit.Owned != nil || len(q.held) > 0 || q.withBackoff
	skipped := s.skipped.list()
	filter := func(retryAt ...bson.E) bson.D {
		f := append(bson.D{{Key: events.FieldStatus, Value: events.StatusNew}}, retryAt...)
		if len(skipped) > 0 {
			f = append(f, bson.E{Key: events.FieldID, Value: bson.D{{Key: "$nin", Value: skipped}}})
		}
		if len(q.exclude) > 0 {
			f = append(f, bson.E{Key: "$nor", Value: q.exclude})
		}
		return f
	}
	opts := options.Find().SetSort(bson.D{{Key: events.FieldCreatedAt, Value: 1}, {Key: events.FieldID, Value: 1}})
	examine := limit.Events
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
		examine = min(max(2*window, 200), 1<<16)
		opts.SetLimit(int64(examine)).SetBatchSize(s.capBatch(oneBatch(examine)))
	} else {
		opts.SetLimit(int64(limit.Events)).SetBatchSize(s.findBatch(limit.Events))
	}
	notLater := bson.D{{Key: "$not", Value: bson.D{{Key: "$gt", Value: now}}}}
	var filters []bson.D
	retryAt := func(v any) bson.E { return bson.E{Key: events.FieldRetryAt, Value: v} }
	switch {
	case q.withBackoff:
		filters = []bson.D{filter()}
	case s.splitClaim:
		opts.SetHint(claimOrderIndex)
		filters = []bson.D{
			filter(retryAt(nil)),
			filter(retryAt(append(bson.D{{Key: "$ne", Value: nil}}, notLater...))),
		}
	default:
		filters = []bson.D{filter(retryAt(notLater))}
	}
	var cursors []*cursorHead
	defer func() {
		for _, c := range cursors {
			c.cur.Close(ctx)
		}
	}()
	for _, f := range filters {
		cur, err := s.coll.Find(ctx, f, opts)
		if err != nil {
			return head{}, fmt.Errorf("find events to claim: %w", err)
		}
		c := &cursorHead{cur: cur}
		cursors = append(cursors, c)
		if err := c.next(ctx); err != nil {
			return head{}, err
		}
	}
	total, read, backingOff := 0, 0, 0
	for {
		var first *cursorHead
		for _, c := range cursors {
			if c.doc != nil && (first == nil || c.before(first)) {
				first = c
			}
		}
		if first == nil {
			h.crowded = backingOff > 0 && read >= examine
			return h, nil
		}
		read++
		switch {
		case q.withBackoff && holdsIfBackingOff(first.doc, now, q.held):
			backingOff++
		case keep(first.doc, limit.Owned, q.held):
			if len(h.docs) > 0 && limit.Bytes > 0 && total+len(first.doc) > limit.Bytes {
				h.more = true
				return h, nil
			}
			h.docs = append(h.docs, first.doc)
			total += len(first.doc)
			if len(h.docs) >= limit.Events {
				h.more = true
				return h, nil
			}
		}
		if err := first.next(ctx); err != nil {
			return head{}, err
		}
	}
}

// holdsIfBackingOff reports whether doc, a NEW event, is backing off (its
// retryAt is still to come), and then holds its ordering key in held.
func holdsIfBackingOff(doc bson.Raw, now time.Time, held map[string]bool) bool {
	retryAt, _ := doc.Lookup(events.FieldRetryAt).TimeOK()
	if !events.Held(events.StatusNew, retryAt, false, now, false) {
		return false
	}
	if key, ok := events.OrderingKey(doc); ok {
		held[key] = true
	}
	return true
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

// cursorHead is a find's cursor and the next document it gives.
type cursorHead struct {
	cur *mongo.Cursor
	doc bson.Raw // nil once the cursor is exhausted
}

func (h *cursorHead) next(ctx context.Context) error {
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
func (h *cursorHead) before(o *cursorHead) bool { return events.CompareOrder(h.doc, o.doc) < 0 }

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
// then FAILED (when failedHolds), then NEW events backing off (when
// backingOff; otherwise the head's read holds their keys). The order
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

func (s *Store) heldKeys(ctx context.Context, now time.Time, failedHolds, backingOff bool) (held map[string]bool, exclude bson.A, err error) {
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
	if backingOff {
		queries = append(queries, heldQuery{filter: bson.D{
			{Key: events.FieldStatus, Value: events.StatusNew},
			{Key: events.FieldRetryAt, Value: bson.D{{Key: "$gt", Value: now}}},
		}, long: true})
	}
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
