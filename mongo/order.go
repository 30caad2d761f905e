package mongo

import (
	"context"
	"errors"
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
//
// Events of paused types (pausedSet) are never kept: with limit.Ordered
// each holds its ordering key as the head meets it, and the paused types
// are read after the probe (beside the held aggregates), so that an idle
// outbox still costs one find.
func (s *Store) findClaimable(ctx context.Context, now time.Time, limit events.ClaimLimit) (docs []bson.Raw, more bool, err error) {
	if !limit.Ordered {
		return s.findUnordered(ctx, now, limit)
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
	// The paused types, read again when the last read is older than
	// PausedTypesMaxAge (an event of one holds its aggregate as the head
	// meets it, see headReader.classify), are read beside the held
	// aggregates: the head needs both and neither needs the other, so
	// through a slow link a claim pays one round trip for the two.
	var paused map[string]bool
	var pausedErr error
	pausedRead := make(chan struct{})
	go func() {
		defer close(pausedRead)
		paused, pausedErr = s.pausedSet(ctx)
	}()
	// FerretDB reads every NEW event for any find on them, so the events
	// backing off come with the head instead of in a find of their own:
	// one such read per claim, not two. However many there are, the read
	// pages on past them (see readHead). Nor does it name the held keys
	// to the server: FerretDB evaluates a $nor in Go, clause by clause,
	// for every NEW event, which costs far more than skipping their
	// events here.
	held, exclude, err := s.heldKeys(ctx, now, limit.FailedHolds, s.splitClaim, limit.Held)
	<-pausedRead
	if err := errors.Join(err, pausedErr); err != nil {
		return nil, false, err
	}
	q := headQuery{held: held, paused: paused}
	if s.splitClaim {
		q.exclude = exclude
	} else {
		q.withBackoff = true
	}
	h, err := s.readHead(ctx, now, limit, q)
	return h.docs, h.more, err
}

// findUnordered is findClaimable without ordering: the events of paused
// types are left out, and nothing else waits for them. The head is read
// first and the paused types after it, so that an idle tick still costs
// one find: when the set read last is older than PausedTypesMaxAge and
// the head had anything (or something was paused), the paused types are
// read again; the events of a type paused since are dropped from the
// batch, and where a type was resumed since, the head is read again with
// the new set, so that either acts on this claim.
func (s *Store) findUnordered(ctx context.Context, now time.Time, limit events.ClaimLimit) ([]bson.Raw, bool, error) {
	last, fresh := s.pausedCache.get()
	h, err := s.readHead(ctx, now, limit, headQuery{paused: last})
	if err != nil || fresh || (len(h.docs) == 0 && len(last) == 0) {
		return h.docs, h.more, err
	}
	paused, err := s.pausedSet(ctx)
	if err != nil {
		return nil, false, err
	}
	for t := range last {
		if !paused[t] {
			h, err = s.readHead(ctx, now, limit, headQuery{paused: paused})
			return h.docs, h.more, err
		}
	}
	kept := h.docs[:0]
	for _, doc := range h.docs {
		if !paused[typeOf(doc)] {
			kept = append(kept, doc)
		}
	}
	return kept, h.more, nil
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
	// paused are the paused event types: their events are skipped, and
	// where held is not nil (an ordered claim) each holds its key as it
	// comes, as an event backing off does. Never written to.
	paused map[string]bool
}

// head is what readHead read: the documents to claim, and whether it
// stopped at a bound (more).
type head struct {
	docs []bson.Raw
	more bool
}

// readHead reads NEW due events in claim order and keeps those of owned
// partitions whose key is not held, up to limit; see findClaimable.
//
// Where it skips events, it reads in pages of a bounded window. Events of
// other replicas' partitions count against the window: reading on to the
// end made every idle tick of a replica whose partitions were drained scan
// the other replicas' whole backlog, a getMore per cursor batch (hundreds
// of commands per 1,000 events with 2 and 4 replicas); owned events
// further down come into the window as the head moves. Events of held
// aggregates do not count: however many there are (a routing key unbound
// for ten minutes holds hundreds of aggregates, each with later events
// waiting), the read pages on past them to the events that may flow, so
// that no number of held aggregates stalls the rest. Its cost is then a
// read of the held events that sit ahead of the first claimable ones.
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
	r := headReader{s: s, now: now, limit: limit, q: q, skipped: s.skipped.list()}
	if limit.Owned != nil || len(q.held) > 0 || q.withBackoff || len(q.paused) > 0 {
		window := limit.Events
		if owned > 0 {
			window = limit.Events * events.Partitions / owned
		}
		r.window = min(max(2*window, 200), 1<<16)
	}
	for {
		more, err := r.page(ctx, &h)
		if err != nil || !more {
			return h, err
		}
	}
}

// headReader is one readHead: its pages, and what they have read so far.
type headReader struct {
	s       *Store
	now     time.Time
	limit   events.ClaimLimit
	q       headQuery
	skipped []any
	// window is the most events of a page not skipped as held; 0 reads
	// one page of limit.Events.
	window int
	// counted is how many events read so far count against the window,
	// bytes the bytes of those kept, and after the last event read.
	counted, bytes int
	after          bson.Raw
	// pages is how many pages were read: each page past held events
	// reads twice as many as the one before, so that a long run of them
	// costs a few finds, not one per window.
	pages int
}

// page reads one page into h, and reports whether the next page may have
// more for it: the page ended at its window with events of held
// aggregates in it, and the batch is not full.
func (r *headReader) page(ctx context.Context, h *head) (next bool, err error) {
	pageLimit := r.limit.Events
	if r.window > 0 {
		pageLimit = min(r.window<<r.pages, 1<<16)
	}
	r.pages++
	opts := options.Find().
		SetSort(bson.D{{Key: events.FieldCreatedAt, Value: 1}, {Key: events.FieldID, Value: 1}}).
		SetLimit(int64(pageLimit)).
		SetBatchSize(r.s.capBatch(oneBatch(pageLimit)))
	filters := r.filters()
	if r.s.splitClaim && !r.q.withBackoff {
		opts.SetHint(claimOrderIndex)
	}
	var cursors []*cursorHead
	defer func() {
		for _, c := range cursors {
			c.cur.Close(ctx)
		}
	}()
	for _, f := range filters {
		cur, err := r.s.coll.Find(ctx, f, opts)
		if err != nil {
			return false, fmt.Errorf("find events to claim: %w", err)
		}
		c := &cursorHead{cur: cur, limit: pageLimit}
		cursors = append(cursors, c)
		if err := c.next(ctx); err != nil {
			return false, err
		}
	}
	heldSkips := 0
	for {
		var first *cursorHead
		for _, c := range cursors {
			if c.doc != nil && (first == nil || c.before(first)) {
				first = c
			}
		}
		if first == nil {
			return false, nil // every find ended before its limit
		}
		doc := first.doc
		if r.after != nil && events.CompareOrder(doc, r.after) <= 0 {
			// read by the page before: not expected, since the next
			// page starts after it, but never read twice
		} else {
			r.after = doc
			switch r.classify(doc) {
			case headHeld:
				heldSkips++
			case headOther:
				r.counted++
			case headKeep:
				r.counted++
				if len(h.docs) > 0 && r.limit.Bytes > 0 && r.bytes+len(doc) > r.limit.Bytes {
					h.more = true
					return false, nil
				}
				h.docs = append(h.docs, doc)
				r.bytes += len(doc)
				if len(h.docs) >= r.limit.Events {
					h.more = true
					return false, nil
				}
			}
		}
		if err := first.next(ctx); err != nil {
			return false, err
		}
		if first.doc == nil && first.read >= first.limit {
			// A find that ended at its limit may have more after it, and
			// the others' next documents may sort after that: the page
			// ends here.
			switch {
			case r.window == 0:
				h.more = true
				return false, nil
			case r.counted >= r.window:
				return false, nil // the window is spent
			default:
				return heldSkips > 0, nil // page on past the held events
			}
		}
	}
}

// What a claim's read makes of an event at the head.
const (
	headKeep  = iota // claimed
	headOther        // another replica's partition: counts against the window
	headHeld         // its aggregate is held (or it is backing off): skipped
)

func (r *headReader) classify(doc bson.Raw) int {
	if owned := r.limit.Owned; owned != nil {
		if p := events.Partition(doc); p >= len(owned) || !owned[p] {
			return headOther
		}
	}
	if r.q.withBackoff && holdsIfBackingOff(doc, r.now, r.q.held) {
		return headHeld
	}
	if len(r.q.held) > 0 {
		if key, ok := events.OrderingKey(doc); ok && r.q.held[key] {
			return headHeld
		}
	}
	if len(r.q.paused) > 0 && r.q.paused[typeOf(doc)] {
		// Paused: it waits, NEW, and with ordering so does the rest of
		// its aggregate, as behind a FAILED event.
		if key, ok := events.OrderingKey(doc); ok && r.q.held != nil {
			r.q.held[key] = true
		}
		return headHeld
	}
	return headKeep
}

// filters are the page's finds: events with a retryAt not in the future,
// in one find or, on MongoDB, two on the index (see findClaimable), each
// from the last event the page before read.
func (r *headReader) filters() []bson.D {
	filter := func(retryAt ...bson.E) bson.D {
		f := append(bson.D{{Key: events.FieldStatus, Value: events.StatusNew}}, retryAt...)
		if r.after != nil {
			// After the last event read, in claim order: on MongoDB an
			// index range on each branch.
			at, id := r.after.Lookup(events.FieldCreatedAt), r.after.Lookup(events.FieldID)
			f = append(f, bson.E{Key: "$or", Value: bson.A{
				bson.D{{Key: events.FieldCreatedAt, Value: bson.D{{Key: "$gt", Value: at}}}},
				bson.D{{Key: events.FieldCreatedAt, Value: at}, {Key: events.FieldID, Value: bson.D{{Key: "$gt", Value: id}}}},
			}})
		}
		if len(r.skipped) > 0 {
			f = append(f, bson.E{Key: events.FieldID, Value: bson.D{{Key: "$nin", Value: r.skipped}}})
		}
		if len(r.q.exclude) > 0 {
			f = append(f, bson.E{Key: "$nor", Value: r.q.exclude})
		}
		return f
	}
	notLater := bson.D{{Key: "$not", Value: bson.D{{Key: "$gt", Value: r.now}}}}
	retryAt := func(v any) bson.E { return bson.E{Key: events.FieldRetryAt, Value: v} }
	switch {
	case r.q.withBackoff:
		return []bson.D{filter()}
	case r.s.splitClaim:
		return []bson.D{
			filter(retryAt(nil)),
			filter(retryAt(append(bson.D{{Key: "$ne", Value: nil}}, notLater...))),
		}
	default:
		return []bson.D{filter(retryAt(notLater))}
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

// cursorHead is a find's cursor and the next document it gives.
type cursorHead struct {
	cur   *mongo.Cursor
	doc   bson.Raw // nil once the cursor is exhausted
	read  int      // documents it gave
	limit int      // the find's limit
}

func (h *cursorHead) next(ctx context.Context) error {
	if h.doc != nil {
		h.read++
	}
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

func (s *Store) heldKeys(ctx context.Context, now time.Time, failedHolds, backingOff bool, also map[string]bool) (held map[string]bool, exclude bson.A, err error) {
	held = map[string]bool{}
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
