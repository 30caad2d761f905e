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
// As in the store: a released key stays,
// as being unparked (plan.Snapshot.Unparking: its events held, neither
// taken nor parked), until every unpark step naming it is written or
// dropped. And, beyond the store (the hole this checker found): a key is
// not released while a park write of its events may still land
// (landing), since a park that lands after the key's unpark leaves an
// event parked behind no cached key.
type parkedCache struct {
	keys     map[string]*parkedEntry
	loadedAt ms // on the replica's clock
	// early (hole 2) forgets a key when its unpark is queued; straggling
	// releases keys whatever their parks in flight, and byKey counts a
	// written step against whatever entry its keys name now, as the store
	// does.
	early, straggling, byKey bool
	// landing counts, by key, the park writes that may still land.
	landing map[string]int
	// trace tells the story of the traced aggregate's key.
	trace func(key, format string, args ...any)
}

type parkedEntry struct {
	key       string
	paused    map[string]bool // types its events were parked for
	held      bool            // some parked behind a hold
	unparking int             // queued steps naming it
}

func (e *parkedEntry) parksNothing() bool { return len(e.paused) == 0 && !e.held }

// Has is what the plan asks of Parked: does key have parked events?
func (c *parkedCache) Has(key string) bool {
	e := c.keys[key]
	return e != nil && !e.parksNothing() && !strings.HasPrefix(key, plan.UnkeyedPrefix)
}

// unparkingView is the keys being unparked (plan.Snapshot.Unparking).
type unparkingView struct{ c *parkedCache }

func (v unparkingView) Has(key string) bool {
	e := v.c.keys[key]
	return e != nil && e.unparking > 0
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
	if reason == events.ParkedPaused {
		e.paused[typ] = true
	} else {
		e.held = true
	}
	c.trace(key, "cache: add %s %s, unparking %d", typ, reason, e.unparking)
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
// term the replica held it with when it queued the step; keys are the
// keys it names, and holds until written. covers are the cache entries
// it counts against: entries, not keys, so that a step queued under an
// earlier term of its partition never settles the entry the partition's
// parked keys were read into under a later one.
type unparkStep struct {
	typ    string // a resumed type's events parked for it, or else
	held   bool   // the events of keys, whatever they were parked for
	keys   []string
	p      int
	term   int64
	covers []*parkedEntry
}

// released finds what nothing holds any more (no type of it paused, no
// FAILED event holding it, no park of it that may still land) and cuts
// it into steps in the owned partitions: one per partition for each
// resumed type, naming the type's keys there (its unkeyed events: every
// partition), then one per partition for the keys parked behind a hold.
func (c *parkedCache) released(paused, failed map[string]bool, terms []int64) []*unparkStep {
	free := func(k string, e *parkedEntry) bool {
		return !e.parksNothing() && !failed[k] && !stillPaused(e, paused) && !c.parking(k)
	}
	found := false
	for k, e := range c.keys { // only whether there is one: order does not matter
		if found = free(k, e); found {
			break
		}
	}
	if !found {
		return nil
	}
	keysOf := map[string][]string{} // by type
	held := map[int][]string{}      // by partition
	for _, k := range slices.Sorted(maps.Keys(c.keys)) {
		e := c.keys[k]
		if !free(k, e) {
			continue
		}
		for t := range e.paused {
			keysOf[t] = append(keysOf[t], k)
		}
		if p := partitionOfKey(k); e.held && p >= 0 && terms[p] != 0 {
			held[p] = append(held[p], k)
		}
		c.trace(k, "cache: released")
		if c.early {
			delete(c.keys, k)
			continue
		}
		e.paused, e.held = map[string]bool{}, false
	}
	var steps []*unparkStep
	for _, t := range slices.Sorted(maps.Keys(keysOf)) {
		for p, term := range terms {
			if term == 0 {
				continue
			}
			st := &unparkStep{typ: t, p: p, term: term}
			for _, k := range keysOf[t] {
				if q := partitionOfKey(k); q < 0 || q == p {
					st.keys = append(st.keys, k)
				}
			}
			steps = append(steps, st)
		}
	}
	for _, p := range slices.Sorted(maps.Keys(held)) {
		steps = append(steps, &unparkStep{held: true, keys: held[p], p: p, term: terms[p]})
	}
	for _, st := range steps {
		for _, k := range st.keys {
			if e := c.keys[k]; e != nil {
				e.unparking++
				st.covers = append(st.covers, e)
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(c.keys)) {
		c.settled(k) // released with no step to wait for (no partition held)
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
	if c.byKey {
		for _, k := range st.keys {
			if e := c.keys[k]; e != nil {
				e.unparking--
				c.settled(k)
			}
		}
		return
	}
	for _, e := range st.covers {
		e.unparking--
		c.trace(e.key, "cache: step %q held %v in %d done, %d to go", st.typ, st.held, st.p, e.unparking)
		if c.keys[e.key] == e {
			c.settled(e.key)
		}
	}
	st.covers = nil
}

// settled forgets k once nothing of it is parked or being unparked, and
// no park of it may still land.
func (c *parkedCache) settled(k string) {
	if e := c.keys[k]; e != nil && e.unparking <= 0 && e.parksNothing() {
		if c.parking(k) {
			e.held = true // the park may land: unparked by a later release
			return
		}
		c.trace(k, "cache: unparked")
		delete(c.keys, k)
	}
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
	readAt ms // on the replica's clock
	at     ms // on the database's, when kept
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
