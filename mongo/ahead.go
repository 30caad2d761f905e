package mongo

import (
	"maps"
	"slices"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/claim/plan"
	"github.com/outboxrelay/outbox/events"
)

// A claim's read of the lane goes on past a full batch, up to aheadBatches
// more, and keeps those documents for the next claims of a drain: one
// sorted read feeds several claims. On FerretDB, which decodes and sorts
// the whole lane for any find on it, that read is most of a claim's cost.
//
// Each claim still reads the holds afresh (PROCESSING, FAILED, backing off
// on MongoDB, the paused types and the parked keys) and classifies what it
// takes from the read-ahead against them and against the keys held when
// it was read, and its write is guarded by status NEW: an event claimed,
// parked or held since the read is not claimed, and an event whose hold
// went since (a stale claim recovered, a FAILED event requeued) waits for
// a read that sees what held it. What could sort before the kept
// documents and turn claimable since without having held its key (an
// event put back by this store: a release, an abandon, a refusal; an
// unpark) drops the read-ahead.
const (
	aheadBatches = 8
	// aheadMaxAge bounds how long a read-ahead serves: events written
	// since wait at most this long for a read that sees them.
	aheadMaxAge = 30 * time.Second
)

// aheadPage is the documents a claim's read kept past its batch, in claim
// order, with the keys held when they were read.
type aheadPage struct {
	docs   []bson.Raw
	held   map[string]bool
	readAt time.Time
	// ended says the read reached the end of the lane: a claim that
	// takes all of docs has seen the whole lane as it was.
	ended bool
}

// readAhead is the read-ahead of a store's claims, and for which claims
// it serves. A page kept by a read is pending until the claim's write
// takes the whole batch read with it (confirm): a claim that writes fewer
// (its fence trimmed the batch, or it wrote nothing) leaves events before
// the page NEW, and the page is dropped.
type readAhead struct {
	mu      sync.Mutex
	page    aheadPage // serves the next claim
	pending aheadPage // kept by the last read, until its write
	// resume is where the next whole read of the lane starts, when one
	// stopped at maxHeadRead (headReader.noteResume).
	resume  headResume
	batch   int // the documents the last read returned
	ordered bool
	owned   []bool
	tenures []int64
}

// put keeps page, read for claims of limit, pending its claim's write.
func (a *readAhead) put(page aheadPage, limit events.ClaimLimit) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.page, a.pending, a.batch, a.ordered = aheadPage{}, page, -1, limit.Ordered
	a.owned, a.tenures = slices.Clone(limit.Owned), slices.Clone(limit.Tenures)
}

// expect notes how many documents the read that kept the pending page
// returned to its claim.
func (a *readAhead) expect(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.batch = n
}

// confirm is told how many documents a claim's write was given: the
// pending page serves the next claim only if that is the whole batch.
func (a *readAhead) confirm(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if n == a.batch && n > 0 {
		a.page = a.pending
	}
	a.pending, a.batch = aheadPage{}, -1
}

// take hands out the read-ahead for a claim of limit at now, and forgets
// it: the claim puts back what it leaves (put), with the time it was read
// at, so that it ages from its read. ok is false when there is none for
// such a claim.
func (a *readAhead) take(limit events.ClaimLimit, now time.Time) (page aheadPage, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	page, a.page, a.pending = a.page, aheadPage{}, aheadPage{}
	ok = len(page.docs) > 0 && limit.Draining && a.ordered == limit.Ordered &&
		slices.Equal(a.owned, limit.Owned) && slices.Equal(a.tenures, limit.Tenures) &&
		now.Sub(page.readAt) < aheadMaxAge
	return page, ok
}

// drop forgets the read-ahead, and where the next read would resume.
func (a *readAhead) drop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.page, a.pending, a.batch, a.resume = aheadPage{}, aheadPage{}, -1, headResume{}
}

// headResume is where a whole read of the lane resumes: after the event
// after, with the keys held when a read stopped there.
type headResume struct {
	after bson.Raw
	held  map[string]bool
	at    time.Time
}

// resumeFrom keeps r (none: zero) for the next reads of claims like
// limit's.
func (a *readAhead) resumeFrom(r headResume, limit events.ClaimLimit) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.resume = r
	if r.after != nil {
		a.ordered, a.owned, a.tenures = limit.Ordered, slices.Clone(limit.Owned), slices.Clone(limit.Tenures)
	}
}

// resumeAt returns where a whole read for a claim of limit at now starts,
// if not at the head: for aheadMaxAge at most, and only for claims of the
// partitions and tenures it was found in, since the keys it holds were
// read with them.
func (a *readAhead) resumeAt(limit events.ClaimLimit, now time.Time) (headResume, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.resume
	ok := r.after != nil && a.ordered == limit.Ordered && slices.Equal(a.owned, limit.Owned) &&
		slices.Equal(a.tenures, limit.Tenures) && now.Sub(r.at) < aheadMaxAge
	return r, ok
}

// fromAhead serves a claim from the read-ahead, planned against q: ok is
// false when there is no read-ahead for it, or it could not fill the
// batch and the lane goes on past it (the claim then reads the lane).
// What the batch leaves of the page, from the event that did not fit,
// serves the next claim.
func (s *Store) fromAhead(now time.Time, limit events.ClaimLimit, q headQuery) (h head, ok bool) {
	page, fits := s.ahead.take(limit, time.Now())
	if !fits {
		return head{}, false
	}
	if q.held != nil {
		// The keys held when the page was read stay held, and those its
		// documents hold as this claim goes through them (events backing
		// off, paused) are kept for the next.
		q.held = maps.Clone(q.held)
		maps.Copy(q.held, page.held)
	}
	p := plan.New(s.snapshot(now, limit, q, 0))
	defer func() { s.outcomeHead(p.Outcome(), false, &h) }()
	for i, doc := range page.docs {
		taken := len(p.Outcome().Batch)
		if p.Step(doc) {
			if len(p.Outcome().Batch) == taken {
				i-- // cut by a bound: it starts what is left
			}
			page.docs, page.held = page.docs[i+1:], p.Outcome().Held
			s.ahead.put(page, limit)
			return h, true
		}
	}
	return h, page.ended
}

// noteResume keeps where the next whole read starts: where this one
// stopped, when it went through maxHeadRead events without filling its
// batch, with every key it held or took (a key whose event it took and
// whose claim fails must not be taken past either); still there when a
// read that began there filled its batch; the head again when one reached
// the end of the lane.
func (r *headReader) noteResume() {
	out := r.outcome()
	switch {
	case !r.plan.Full() && out.Read >= r.s.maxRead():
		held := maps.Clone(out.Held)
		for _, doc := range out.Batch {
			if key, ok := events.OrderingKey(doc); ok {
				held[key] = true
			}
		}
		r.s.ahead.resumeFrom(headResume{after: r.after, held: held, at: time.Now()}, r.limit)
	case r.resumed && !r.h.ended:
	default:
		r.s.ahead.resumeFrom(headResume{}, r.limit)
	}
}

// maxRead is maxHeadRead, or the bound a test set.
func (s *Store) maxRead() int {
	if s.headReadMax > 0 {
		return s.headReadMax
	}
	return maxHeadRead
}
