package mongo

import (
	"context"
	"fmt"
	"maps"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/claim/plan"
	"github.com/outboxrelay/outbox/events"
)

// headQuery says which events of the head a claim leaves out.
type headQuery struct {
	// ordered: the events of a key wait behind its earlier ones (held,
	// failed, and the store's parked keys); without it only paused types
	// are left out.
	ordered bool
	// held are the ordering keys whose events are not claimed now: a
	// worker has one in flight, or (withBackoff) one is backing off. The
	// read adds to it as the head goes.
	held map[string]bool
	// failed are the keys a FAILED event holds: their events are parked.
	failed map[string]bool
	// withBackoff reads the events backing off too, and holds their keys
	// as they come: an event sorts before every later event of its key,
	// so its hold is known before they are read (FerretDB, whose one find
	// reads them anyway).
	withBackoff bool
	// paused are the paused event types: their events are parked, and
	// with ordered their keys held. Never written to.
	paused map[string]bool
}

// head is what readHead read: the documents to claim, whether it stopped
// at a bound (more), and what it found to park or stamp.
type head struct {
	docs    []bson.Raw
	more    bool
	parking parking
	// ahead are the documents read past the batch, unclassified (see
	// readAhead), and ended says the read reached the end of the lane.
	ahead []bson.Raw
	ended bool
	// held are the keys held when the read stopped, for the read-ahead.
	held map[string]bool
}

// maxHeadRead bounds the documents one claim's read goes through: past it
// the claim takes what it found, and the next read goes on from where it
// stopped (readAhead.resumeAt), with the keys it held: events held for
// now (behind one in flight or backing off) are read and left NEW, and
// more of them than the bound at the head would otherwise stop every
// claim before anything it may take.
const maxHeadRead = 1 << 16

// readHead reads the claim's lane in claim order (createdAt, then _id)
// and plans the claim over it (claim/plan), up to limit; see
// findClaimable.
//
// On MongoDB the lane is the index {status, parked, retryAt, partition,
// createdAt, _id}: a find names the owned partitions (and null, for
// events written without one), so that another replica's events are
// never read, and each page costs what it returns. A page that ends at
// its limit with the batch not full is followed by one twice as large.
// On FerretDB, which sorts in Go whatever the filter, a page costs a sort
// of the lane; the read-ahead (ahead.go) spreads it over several claims.
func (s *Store) readHead(ctx context.Context, now time.Time, limit events.ClaimLimit, q headQuery) (h head, err error) {
	defer func() { s.noteReplySizes(ctx, h.docs, err) }()
	if limit.Owned != nil && ownedList(limit.Owned) == nil {
		return head{}, nil
	}
	r := headReader{s: s, now: now, limit: limit, q: q, skipped: s.skipped.list(), h: &h}
	if batch := oneBatch(limit.Events); s.capBatch(batch) == batch {
		// No read-ahead while replies are cut short (large documents, a
		// find that failed): there it would cost round trips.
		r.aheadMax = aheadBatches * limit.Events
		r.share = s.lane.window(limit.Owned)
	}
	r.withBackoff = q.withBackoff
	return h, s.lane.read(ctx, &r)
}

// readPages reads the lane whole, page after page, from the head or from
// where the last read stopped at its bound (noteResume), and plans over it.
func (r *headReader) readPages(ctx context.Context) error {
	q := r.q
	if at, ok := r.s.ahead.resumeAt(r.limit, time.Now()); ok {
		r.after, r.resumed = at.after, true
		q.held = maps.Clone(q.held)
		maps.Copy(q.held, at.held)
	}
	r.plan = plan.New(r.s.snapshot(r.now, r.limit, q, r.aheadMax))
	for {
		next, err := r.page(ctx)
		if err != nil || !next {
			r.finish()
			if err == nil {
				r.noteResume()
			}
			return err
		}
	}
}

// snapshot is what a claim of limit plans with (claim/plan): the holds q
// read, the keys this store knows to have parked events, and how the
// store reads its lane.
func (s *Store) snapshot(now time.Time, limit events.ClaimLimit, q headQuery, ahead int) plan.Snapshot {
	snap := plan.Snapshot{
		Now: now, Ordered: q.ordered, Owned: limit.Owned,
		Events: limit.Events, Bytes: limit.Bytes, Ahead: ahead,
		Held: q.held, Failed: q.failed, Paused: q.paused,
		Parked: parkedView{&s.parked}, Unparking: unparkingView{&s.parked},
		WithBackoff: q.withBackoff,
	}
	s.lane.shape(&snap)
	return snap
}

// outcomeHead turns a plan's outcome into what the claim claims, keeps
// and parks, and notes the keys it parks in the store's cache. Events
// read by partition are parked by partition (byPartition).
func (s *Store) outcomeHead(out plan.Outcome, byPartition bool, h *head) {
	h.docs, h.ahead, h.held = out.Batch, out.Ahead, out.Held
	h.parking.cap = s.lane.parkCap()
	h.more = h.more || out.More
	for _, pk := range out.Park {
		at := -1
		if byPartition {
			at = events.Partition(pk.Doc)
		}
		h.parking.addPark(pk.Reason, at, events.Partition(pk.Doc), pk.Key, rawID(pk.Doc.Lookup(events.FieldID)))
		s.parked.add(pk.Key, typeOf(pk.Doc), pk.Reason, stamped(pk.Doc))
	}
	for _, doc := range out.Stamp {
		h.parking.addStamp(events.Partition(doc), rawID(doc.Lookup(events.FieldID)))
	}
}

// sharedAndFull reports whether a read of the whole lane filled its
// batch and read-ahead with more after it, in a lane this replica
// shares: on FerretDB it decoded every replica's NEW events to find its
// own, where a read by partition decodes its own until its batch is
// full.
func (r *headReader) sharedAndFull() bool {
	owned := ownedList(r.limit.Owned)
	return r.plan.Full() && !r.h.ended && owned != nil && len(owned) < events.Partitions
}

// aheadShareMax bounds shareOf.
const aheadShareMax = 4

// shareOf is how many times its own window a whole read of a shared lane
// reads on FerretDB: about the number of replicas sharing it (the
// partitions over those owned), at most aheadShareMax. FerretDB decodes
// and sorts the whole lane for any window, so a wider one costs only its
// reply; with three replicas a window of one replica's size held a third
// of their own, and they read the lane three times as often as one
// replica (42 whole and partition finds against 4, draining 10,000
// events).
func shareOf(owned []bool) int {
	n := len(ownedList(owned))
	if n == 0 || n >= events.Partitions {
		return 1
	}
	return min((events.Partitions+n-1)/n, aheadShareMax)
}

// headReader is one readHead: its pages, and the plan they feed.
type headReader struct {
	s       *Store
	now     time.Time
	limit   events.ClaimLimit
	q       headQuery
	skipped []any
	h       *head
	// plan decides what the claim makes of each event read.
	plan        *plan.Planner
	withBackoff bool
	// after is the last event read, and pages how many pages were read.
	after bson.Raw
	pages int
	// aheadMax bounds the read-ahead; a whole read's window is share
	// times as wide (shareOf; otherwise 1).
	aheadMax int
	share    int
	// byPartition reads one partition's lane at a time, partition's
	// (FerretDB, partitionreads.go).
	byPartition bool
	partition   int
	// resumed says the read began where the last one stopped at
	// r.s.maxRead() (readAhead.resumeAt).
	resumed bool
}

func (r *headReader) outcome() plan.Outcome { return r.plan.Outcome() }

// finish hands the plan's outcome to the head read.
func (r *headReader) finish() { r.s.outcomeHead(r.outcome(), r.byPartition, r.h) }

// page reads one page, and reports whether the next page may have more.
func (r *headReader) page(ctx context.Context) (next bool, err error) {
	// The first page holds the batch and the read-ahead, and comes back
	// in one reply, so that its cursor is closed by the server (no
	// killCursors round trip). On MongoDB the next pages double. On
	// FerretDB, where each page sorts the whole lane again, the second
	// has no limit and is read as far as needed: a head the claim reads
	// past costs two sorts, not one per page.
	pageLimit := min(r.window()<<r.pages, r.s.maxRead())
	if r.pages > 0 {
		pageLimit = r.s.lane.nextPageLimit(pageLimit)
	}
	opts := options.Find().
		SetSort(bson.D{{Key: events.FieldCreatedAt, Value: 1}, {Key: events.FieldID, Value: 1}}).
		SetBatchSize(r.s.capBatch(oneBatch(r.window())))
	if pageLimit > 0 {
		opts.SetLimit(int64(pageLimit)).SetBatchSize(r.s.capBatch(oneBatch(pageLimit)))
	}
	if hint := r.s.lane.hint(); hint != "" {
		opts.SetHint(hint)
	}
	r.pages++
	var cursors []*cursorHead
	defer func() {
		for _, c := range cursors {
			closeCursor(ctx, c.cur)
		}
	}()
	for _, f := range r.filters() {
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
	for {
		first := firstOf(cursors)
		if first == nil {
			r.h.ended = true
			return false, nil // every find ended before its limit
		}
		if r.after == nil || events.CompareOrder(first.doc, r.after) > 0 {
			r.after = first.doc
			if done := r.plan.Step(first.doc); done {
				return false, nil
			}
		}
		if err := first.next(ctx); err != nil {
			return false, err
		}
		full, read := r.plan.Full(), r.outcome().Read
		if pageLimit > 0 && first.doc == nil && first.read >= first.limit {
			// A find that ended at its limit may have more after it, and
			// the others' next documents may sort after that: the page
			// ends here, and unless the batch is full the next reads on.
			return !full && read < r.s.maxRead(), nil
		}
		if !full && read >= r.s.maxRead() {
			r.h.more = true
			return false, nil
		}
	}
}

// window is the documents a whole read's first page returns: the batch
// and its read-ahead, share times.
func (r *headReader) window() int {
	return (r.limit.Events + r.aheadMax) * max(r.share, 1)
}

// filters are the page's finds, each from the last event the page before
// read: the lane's NEW events whose retryAt is not in the future (or, where
// the plan holds their keys, backing off too), as the dialect reads them
// (laneClauses, retryClauses).
func (r *headReader) filters() []bson.D {
	var out []bson.D
	for _, retry := range r.s.lane.retryClauses(r.now, r.withBackoff) {
		f := append(bson.D{{Key: events.FieldStatus, Value: events.StatusNew}}, r.s.lane.laneClauses(r)...)
		f = append(f, retry...)
		if r.after != nil {
			// After the last event read, in claim order: on MongoDB an
			// index range on each partition.
			at, id := r.after.Lookup(events.FieldCreatedAt), r.after.Lookup(events.FieldID)
			f = append(f, bson.E{Key: "$or", Value: bson.A{
				bson.D{{Key: events.FieldCreatedAt, Value: bson.D{{Key: "$gt", Value: at}}}},
				bson.D{{Key: events.FieldCreatedAt, Value: at}, {Key: events.FieldID, Value: bson.D{{Key: "$gt", Value: id}}}},
			}})
		}
		if len(r.skipped) > 0 {
			f = append(f, bson.E{Key: events.FieldID, Value: bson.D{{Key: "$nin", Value: r.skipped}}})
		}
		out = append(out, f)
	}
	return out
}

// lanePartitions are the values of the partition field a claim reads: the
// owned partitions (every one when owned is nil), and null, for the
// events written without one, which the claim then stores.
func lanePartitions(owned []bool) bson.A {
	out := bson.A{nil}
	for p := range events.Partitions {
		if owned == nil || owned[p] {
			out = append(out, int32(p))
		}
	}
	return out
}

// cursorHead is a find's cursor and the next document it gives.
type cursorHead struct {
	cur   *mongo.Cursor
	doc   bson.Raw // nil once the cursor is exhausted
	read  int      // documents it gave
	limit int      // the find's limit, 0 for none
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

// firstOf is the find whose next document sorts first (createdAt, then
// _id), to merge the finds; nil when all are exhausted.
func firstOf(cursors []*cursorHead) *cursorHead {
	var first *cursorHead
	for _, c := range cursors {
		if c.doc != nil && (first == nil || events.CompareOrder(c.doc, first.doc) < 0) {
			first = c
		}
	}
	return first
}
