package check

import (
	"slices"
	"strings"

	"github.com/outboxrelay/outbox/claim/plan"
	"github.com/outboxrelay/outbox/events"
)

// replica is one worker: a claim loop (cycle, a step machine driven by
// the replies of its commands) and a publisher. Its terms are what it
// believes it holds; expiry is measured on the monotonic clock from when
// it sent the renewal that the database granted, so it ends no later
// than the table's.
type replica struct {
	s                 *sim
	id                int
	terms             []int64
	expiry            []ms
	loaded, leaving   []bool
	inflight, parkEnd []ms // when the lane (park) writes sent can land no more
	offset            ms   // its wall clock's error
	stalledUntil      ms
	cache             parkedCache
	unparks           []*unparkStep
	ahead             readAhead
	held              map[string]int // keys in flight or in doubt
	aheadNotBefore    ms             // no read-ahead read before this serves
	draining          bool
	tokens            int64
	doubts            []*doubt
	pub               publisher
}

// doubt is a claim write whose reply never came: it may land until end.
type doubt struct {
	token int64
	keys  []string
	end   ms
}

func newReplica(s *sim, id int) *replica {
	r := &replica{s: s, id: id, terms: make([]int64, partitions), expiry: make([]ms, partitions),
		loaded: make([]bool, partitions), leaving: make([]bool, partitions),
		inflight: make([]ms, partitions), parkEnd: make([]ms, partitions), held: map[string]int{}}
	r.cache.early, r.cache.straggling = s.knobs.EarlyRelease, s.knobs.StragglingPark
	r.cache.byKey = s.knobs.StaleSteps
	r.cache.landing = map[string]int{}
	r.cache.trace = func(key, format string, args ...any) {
		if s.traceAgg != "" && strings.HasSuffix(key, "\x00"+s.traceAgg) {
			s.tracef(s.traceAgg, "replica %d "+format, append([]any{id}, args...)...)
		}
	}
	r.pub.r = r
	return r
}

func (r *replica) clock() ms { return r.s.now + r.offset }

func (r *replica) ownedList() []int {
	var ps []int
	for p, t := range r.terms {
		if t != 0 && !r.leaving[p] {
			ps = append(ps, p)
		}
	}
	return ps
}

func (r *replica) acquire(p int, term int64, expiry ms) {
	r.cache.forget(p)
	r.terms[p], r.expiry[p], r.loaded[p], r.leaving[p] = term, expiry, false, false
}

// lose forgets partition p (given back, or its term ran out).
func (r *replica) lose(p int) {
	r.terms[p], r.loaded[p], r.leaving[p] = 0, false, false
	r.cache.forget(p)
}

// budget is the time a lane write in partitions ps may be sent with: it
// must land within each partition's term as the replica knows it (the
// term it read under, not given back or leaving), netMax before the
// term's end since the database runs it for its budget from its arrival.
func (r *replica) budget(ps []int, terms []int64) (ms, bool) {
	b := r.s.cfg.budget
	for _, p := range ps {
		if r.terms[p] == 0 || r.terms[p] != terms[p] || r.leaving[p] {
			return 0, false
		}
		b = min(b, r.expiry[p]-r.s.cfg.netMax-r.s.now)
	}
	return b, b >= minBudget
}

// sendLane sends a lane write in partitions ps under terms, and notes how
// long it can land, for a give-back to wait out. unguarded is the late
// park of hole 4: no term check, not waited for.
func (r *replica) sendLane(u *update, ps []int, terms []int64, unguarded bool, done func(any, bool), late func(any)) bool {
	b, ok := r.budget(ps, terms)
	if unguarded {
		b, ok = r.s.cfg.budget, true
	}
	if !ok {
		return false
	}
	u.lane, u.terms = r, slices.Clone(terms)
	end := r.s.now + b + r.s.cfg.netMax
	for _, p := range ps {
		if !unguarded {
			r.inflight[p] = max(r.inflight[p], end)
		}
		if u.name == "park" {
			r.parkEnd[p] = max(r.parkEnd[p], end)
		}
	}
	r.s.call(r, b, func(end ms, reply func(any)) { r.s.db.update(u, end, reply) }, done, late)
	return true
}

// renew extends the terms held, one command for all, guarded by the
// term; the expiry counts from the send.
func (r *replica) renew() {
	sent, terms := r.s.now, slices.Clone(r.terms)
	r.s.call(r, r.s.cfg.budget, func(_ ms, reply func(any)) {
		granted := make([]bool, partitions)
		for p, t := range terms {
			if o := &r.s.own[p]; t != 0 && o.replica == r.id && o.term == t && r.s.now <= o.expiry {
				o.expiry, granted[p] = r.s.now+lease, true
			}
		}
		reply(granted)
	}, func(res any, ok bool) {
		if ok {
			for p, t := range terms {
				if t != 0 && r.terms[p] == t && res.([]bool)[p] {
					r.expiry[p] = max(r.expiry[p], sent+lease)
				}
			}
		}
	}, nil)
	r.s.after(renewEvery, r, r.renew)
}

// dropExpired lets go of the terms it can no longer write in.
func (r *replica) dropExpired() {
	for p, t := range r.terms {
		if t != 0 && r.expiry[p]-r.s.cfg.netMax-minBudget < r.s.now {
			r.lose(p)
		}
	}
}

// giveBack stops claiming in p at once, and gives it back once every lane
// write sent in it can land no more.
func (r *replica) giveBack(p int) {
	if r.terms[p] == 0 || r.leaving[p] {
		return
	}
	if r.parkEnd[p] > r.s.now {
		r.s.c.ParkAcrossGiveBack++
	}
	r.leaving[p] = true
	term := r.terms[p]
	r.s.at(max(r.s.now, r.inflight[p])+1, r, func() {
		if r.terms[p] != term {
			return
		}
		if o := &r.s.own[p]; o.replica == r.id && o.term == term {
			o.replica = -1
			r.s.tracePartition(p, "partition %d given back by replica %d (term %d)", p, r.id, term)
		}
		r.lose(p)
	})
}

// hold and unhold count the keys in flight or in doubt, which a claim
// leaves out whatever the database says.
func (r *replica) hold(keys []string) {
	for _, k := range keys {
		r.held[k]++
	}
}

func (r *replica) unhold(keys []string) {
	for _, k := range keys {
		if r.held[k]--; r.held[k] <= 0 {
			delete(r.held, k)
		}
	}
}

// next schedules the next cycle.
func (r *replica) next(d ms) { r.s.after(d, r, r.cycle) }

// cycle is one claim: release what a lost claim write may hold, load the
// parked keys of new partitions, read the paused types and the holds,
// write unpark steps, read the lane (or serve from the read-ahead), plan
// with the real Planner, park, claim, hand the batch to the publisher.
func (r *replica) cycle() {
	if r.s.over {
		return
	}
	r.dropExpired()
	if i := slices.IndexFunc(r.doubts, func(d *doubt) bool { return d.end < r.s.now }); i >= 0 {
		r.release(r.doubts[i])
		return
	}
	if r.pub.next != nil {
		r.next(5)
		return
	}
	if r.clock()-r.cache.loadedAt >= parkedReload {
		r.s.tracef(r.s.traceAgg, "replica %d reloads its parked keys", r.id)
		r.cache.reset(r.clock())
		clear(r.loaded)
	}
	var load []bool
	for p, t := range r.terms {
		if t != 0 && !r.loaded[p] {
			if load == nil {
				load = make([]bool, partitions)
			}
			load[p] = true
		}
	}
	if load != nil {
		r.loadParked(load)
		return
	}
	r.readPaused(&claim{now: r.clock()})
}

// release puts back to NEW what a claim write in doubt won, once it can
// land no more: then its keys stop being held.
func (r *replica) release(d *doubt) {
	u := &update{name: "release", match: func(x *doc) bool {
		return x.status == statusProcessing && x.worker == r.id && x.token == d.token
	}, set: func(x *doc) { x.status, x.worker, x.token, x.attempts = statusNew, -1, 0, x.attempts-1 }}
	r.s.call(r, r.s.cfg.budget, func(end ms, reply func(any)) { r.s.db.update(u, end, reply) },
		func(_ any, ok bool) {
			if ok {
				r.doubts = slices.DeleteFunc(r.doubts, func(x *doubt) bool { return x == d })
				r.unhold(d.keys)
				r.ahead.drop()
			}
			r.next(1)
		}, nil)
}

// loadParked reads the parked events of the partitions in ps.
func (r *replica) loadParked(ps []bool) {
	terms := slices.Clone(r.terms)
	r.s.call(r, r.s.cfg.budget, func(_ ms, reply func(any)) { reply(r.s.db.parkedIn(ps)) },
		func(res any, ok bool) {
			if ok {
				for _, d := range res.([]*doc) {
					if r.terms[d.partition] == terms[d.partition] {
						r.cache.add(plan.ParkedKey(d.encode()), d.typ, d.parkedFor)
					}
				}
				for p, in := range ps {
					if in && r.terms[p] == terms[p] {
						r.loaded[p] = true
					}
				}
			}
			r.next(1)
		}, nil)
}

// claim is one cycle's reads: when the database answered them (for the
// oracle), and what they said.
type claim struct {
	// now is the claim's time on the replica's clock, one for all its
	// reads (the store's lease.At): a clock that jumps between the read
	// of the holds and the lane's must not free a key that backs off.
	now              ms
	pausedAt, heldAt ms
	paused           map[string]bool
	holds            holds
	owned            []bool
	terms            []int64
}

func (r *replica) readPaused(c *claim) {
	r.s.call(r, r.s.cfg.budget, func(_ ms, reply func(any)) {
		c.pausedAt = r.s.now
		m := map[string]bool{}
		for _, t := range r.s.db.pausedTypes() {
			m[t] = true
		}
		reply(m)
	}, func(res any, ok bool) {
		if !ok {
			r.next(10)
			return
		}
		c.paused = res.(map[string]bool)
		r.readHeld(c)
	}, nil)
}

func (r *replica) readHeld(c *claim) {
	now := c.now
	r.s.call(r, r.s.cfg.budget, func(_ ms, reply func(any)) {
		c.heldAt = r.s.now
		reply(r.s.db.holds(now))
	}, func(res any, ok bool) {
		if !ok {
			r.next(10)
			return
		}
		c.holds = res.(holds)
		if !r.s.cfg.failedHolds {
			c.holds.failed = nil
		}
		r.unparks = append(r.unparks, r.cache.released(c.paused, c.holds.failed, r.liveTerms())...)
		r.unpark(c, r.s.cfg.unparkSteps)
	}, nil)
}

// liveTerms are the terms of the partitions it claims in.
func (r *replica) liveTerms() []int64 {
	t := slices.Clone(r.terms)
	for p := range t {
		if r.leaving[p] {
			t[p] = 0
		}
	}
	return t
}

// unpark writes up to n queued steps, in order; a step whose partition
// is no longer held under its term is dropped; one that fails stays
// first in line for the next claim.
func (r *replica) unpark(c *claim, n int) {
	if len(r.unparks) == 0 || n == 0 {
		r.readLane(c)
		return
	}
	st := r.unparks[0]
	if r.s.knobs.StaleSteps && r.terms[st.p] != 0 && !r.leaving[st.p] {
		st.term = r.terms[st.p] // the store drops a step only if not owned now
	}
	terms := make([]int64, partitions)
	terms[st.p] = st.term
	u := &update{name: "unpark", match: func(d *doc) bool {
		if d.status != statusNew || !d.parked || d.partition != st.p {
			return false
		}
		if !st.held {
			return d.parkedFor == events.ParkedPaused && d.typ == st.typ
		}
		return slices.Contains(st.keys, plan.ParkedKey(d.encode()))
	}, set: func(d *doc) { d.parked, d.parkedFor = false, "" }}
	sent := r.sendLane(u, []int{st.p}, terms, false, func(res any, ok bool) {
		if !ok {
			// In doubt, it may still land and put back events that sort
			// before the read-ahead, and its retry will then move
			// nothing: the page goes now, and no page read before the
			// step can land no more serves (the store drops it only
			// when a step moved events; the knob UnparkInDoubt keeps
			// that).
			if !r.s.knobs.UnparkInDoubt {
				r.ahead.drop()
				r.aheadNotBefore = max(r.aheadNotBefore, r.inflight[st.p])
			}
			r.readLane(c)
			return
		}
		r.unparks = r.unparks[1:]
		r.cache.written(st)
		if len(res.([]string)) > 0 {
			r.ahead.drop() // what it unparked may sort before the page
		}
		r.unpark(c, n-1)
	}, nil)
	switch {
	case sent:
	case r.terms[st.p] != st.term || r.leaving[st.p]:
		// Its partition is gone: the next owner reads its parked events.
		r.unparks = r.unparks[1:]
		r.cache.written(st)
		r.unpark(c, n)
	default:
		r.readLane(c) // too little of the term left to write it: later
	}
}
