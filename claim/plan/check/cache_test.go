package check

import (
	"maps"
	"slices"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/claim/plan"
	"github.com/outboxrelay/outbox/events"
)

// parkedCache is a replica's parked keys (mongo/lane.go's parkedKeys):
// what it knows of the parked events of its partitions, by key (a type's
// unkeyed events under plan.UnkeyedPrefix).
//
// Its invariant, in the model without knobs: a key stays in the cache,
// and so keeps holding its later events, from the moment an event of it
// is parked until every unpark step that puts its parked events back in
// the lane has been written. A release queues the steps of the types
// resumed, then each key's own step last, which unparks whatever of the
// key is parked, so what a claim parks of a key while its release is
// under way is unparked with the rest, as long as the key's step is
// still to come; what is parked after that waits for the next release.
// And a key is not released while a park write of its events may still
// land (landing): a park that lands after the key's unpark would leave an
// event parked behind no cached key.
type parkedCache struct {
	keys     map[string]*parkedEntry
	loadedAt ms // on the replica's clock
	early    bool
	// landing counts, by key, the park writes that may still land;
	// straggling (the knob StragglingPark) releases keys regardless, as
	// the store does.
	landing    map[string]int
	straggling bool
	// trace tells the story of the traced aggregate's key.
	trace func(key, format string, args ...any)
}

type parkedEntry struct {
	key    string
	paused map[string]bool // types its events were parked for
	held   bool            // some parked behind a hold
	// releasing: its unpark steps are queued (pending of them not
	// written yet; keyPending: its own step among them); reparked: a
	// claim parked more of it after its own step.
	releasing, keyPending, reparked bool
	pending                         int
}

// Has is what the plan asks: does key have parked events?
func (c *parkedCache) Has(key string) bool {
	return c.keys[key] != nil && !strings.HasPrefix(key, plan.UnkeyedPrefix)
}

func (c *parkedCache) add(key, typ, reason string) {
	if c.keys == nil {
		c.keys = map[string]*parkedEntry{}
	}
	e := c.keys[key]
	if e == nil {
		e = &parkedEntry{key: key, paused: map[string]bool{}}
		c.keys[key] = e
	}
	if e.releasing && !e.keyPending {
		e.reparked = true
	}
	if reason == events.ParkedPaused {
		e.paused[typ] = true
	} else {
		e.held = true
	}
	c.trace(key, "cache: add %s %s releasing %v keyPending %v reparked %v", typ, reason, e.releasing, e.keyPending, e.reparked)
}

// partitionOfKey is the partition a cache key's events are in; -1 for a
// type's unkeyed events, which spread over every partition.
func partitionOfKey(key string) int {
	if strings.HasPrefix(key, plan.UnkeyedPrefix) {
		return -1
	}
	return events.PartitionOf(key)
}

// forget drops the keys of partition p (lost).
func (c *parkedCache) forget(p int) {
	for _, k := range slices.Sorted(maps.Keys(c.keys)) {
		if partitionOfKey(k) == p {
			c.trace(k, "cache: forget")
			delete(c.keys, k)
		}
	}
}

// unparkStep is one write of an unpark (mongo/unpark.go): the events of a
// resumed type, or of released keys, parked in one partition, under the
// term the replica held it with when it queued the step.
type unparkStep struct {
	typ    string   // a resumed type's events parked for it, or
	keys   []string // the events of these keys, whatever they were parked for
	p      int
	term   int64
	covers []*parkedEntry
}

// released takes what nothing holds any more (no type of it paused, no
// FAILED event holding it) and cuts it into steps in the owned
// partitions: a step per partition for each resumed type, then one per
// partition for the released keys. With the knob early (hole 2) the keys
// leave the cache at once, and only keys parked behind a hold get a step
// of their own, as in the store before its fix; otherwise every key
// leaves when its last step is written.
func (c *parkedCache) released(paused, failed map[string]bool, terms []int64) []*unparkStep {
	var types []string
	byP := map[int][]*parkedEntry{}
	for _, k := range slices.Sorted(maps.Keys(c.keys)) {
		e := c.keys[k]
		if e.releasing || failed[k] || stillPaused(e, paused) || c.parking(k) {
			continue
		}
		for t := range e.paused {
			types = append(types, t)
		}
		if p := partitionOfKey(k); p >= 0 && terms[p] != 0 && (e.held || !c.early) {
			byP[p] = append(byP[p], e)
		}
		if c.early {
			delete(c.keys, k)
		}
	}
	slices.Sort(types)
	types = slices.Compact(types)
	var steps []*unparkStep
	for _, t := range types {
		for p, term := range terms {
			if term != 0 {
				steps = append(steps, &unparkStep{typ: t, p: p, term: term})
			}
		}
	}
	for _, p := range slices.Sorted(maps.Keys(byP)) {
		st := &unparkStep{p: p, term: terms[p]}
		for _, e := range byP[p] {
			st.keys = append(st.keys, e.key)
		}
		steps = append(steps, st)
	}
	if c.early {
		return steps
	}
	for _, k := range slices.Sorted(maps.Keys(c.keys)) {
		e := c.keys[k]
		if e.releasing || failed[k] || stillPaused(e, paused) || c.parking(k) {
			continue
		}
		e.releasing = true
		p := partitionOfKey(k)
		for _, st := range steps {
			if st.typ != "" && e.paused[st.typ] && (p < 0 || p == st.p) || slices.Contains(st.keys, k) {
				e.pending++
				e.keyPending = e.keyPending || st.typ == ""
				st.covers = append(st.covers, e)
			}
		}
		c.trace(k, "cache: release, %d steps", e.pending)
		e.paused, e.held = map[string]bool{}, false
		if e.pending == 0 {
			c.finish(e)
		}
	}
	return steps
}

func stillPaused(e *parkedEntry, paused map[string]bool) bool {
	for t := range e.paused {
		if paused[t] {
			return true
		}
	}
	return false
}

// written notes that st was written (or dropped with its partition).
func (c *parkedCache) written(st *unparkStep) {
	for _, e := range st.covers {
		if st.typ == "" {
			e.keyPending = false
		}
		if e.pending--; e.pending == 0 {
			c.finish(e)
		}
	}
	st.covers = nil
}

// finish ends e's release: it leaves the cache, unless a claim parked
// more of it after its own step, which the next release unparks.
func (c *parkedCache) finish(e *parkedEntry) {
	if c.keys[e.key] != e {
		return // reloaded or forgotten since
	}
	c.trace(e.key, "cache: released, reparked %v", e.reparked)
	if e.reparked || c.parking(e.key) {
		e.releasing, e.reparked, e.keyPending, e.held = false, false, false, true
		return
	}
	delete(c.keys, e.key)
}

// parking reports whether a park write of key's events may still land.
func (c *parkedCache) parking(key string) bool { return !c.straggling && c.landing[key] > 0 }

// reset forgets every key but those a park write may still land for
// (mongo/lane.go's reload, which then reads the parked keys again).
func (c *parkedCache) reset(now ms) {
	c.keys, c.loadedAt = nil, now
	for _, k := range slices.Sorted(maps.Keys(c.landing)) {
		if c.parking(k) && !strings.HasPrefix(k, plan.UnkeyedPrefix) {
			c.add(k, "", events.ParkedHeld)
		}
	}
}

// aheadPage is what a lane read kept past its batch (mongo/ahead.go).
type aheadPage struct {
	docs   []bson.Raw
	held   map[string]bool
	readAt ms
	ended  bool
}

// readAhead keeps a page pending until the claim's write takes the whole
// batch read with it (confirm), and serves it only to a draining claim
// of the same partitions and terms, within aheadMaxAge.
type readAhead struct {
	page, pending aheadPage
	batch         int
	owned         []bool
	terms         []int64
}

func (a *readAhead) put(p aheadPage, owned []bool, terms []int64) {
	a.page, a.pending, a.batch = aheadPage{}, p, -1
	a.owned, a.terms = slices.Clone(owned), slices.Clone(terms)
}

func (a *readAhead) expect(n int) { a.batch = n }

func (a *readAhead) confirm(n int) {
	if n == a.batch && n > 0 {
		a.page = a.pending
	}
	a.pending, a.batch = aheadPage{}, -1
}

func (a *readAhead) take(owned []bool, terms []int64, now ms, draining bool) (aheadPage, bool) {
	p := a.page
	a.page, a.pending = aheadPage{}, aheadPage{}
	ok := len(p.docs) > 0 && draining && slices.Equal(a.owned, owned) &&
		slices.Equal(a.terms, terms) && now-p.readAt < aheadMaxAge
	return p, ok
}

func (a *readAhead) drop() { a.page, a.pending, a.batch = aheadPage{}, aheadPage{}, -1 }
