// Package plan decides what one ordered claim takes from its lane: a pure
// function of a snapshot, with no I/O and no state that outlives the call.
//
// The store reads the snapshot (the lane's NEW events in claim order, the
// keys held and why, the paused types, the keys with parked events, the
// partitions owned, the limits), hands the documents to a Planner one at
// a time as it reads them, and then writes the Outcome: it claims the
// batch, parks what must wait, and keeps the read-ahead for the next claim
// of a drain. Everything that decides order is here, so that the promise
// below can be read in one file and tested as a function (plan_test.go).
//
// # The promise
//
// With Ordered, for every ordering key, what the batch takes of the key is
// a prefix of the key's events in the lane: no event is taken while an
// earlier event of its key is held (in flight, backing off, FAILED,
// parked or being unparked, or of a paused type), left out, or cut from the batch by a
// bound. The read-ahead starts where the batch stopped, with the event a
// bound cut (never dropped), so a claim served from it keeps the prefix
// across claims too. With or without Ordered, nothing of a paused type is
// taken, the batch holds at most Events documents and at most Bytes bytes
// (a first document larger than Bytes alone excepted), and the read-ahead
// holds at most Ahead documents.
package plan

import (
	"maps"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
)

// Keys is a read-only set of ordering keys: the keys with parked events,
// as one claim's snapshot sees them.
type Keys interface {
	Has(key string) bool
}

// KeySet is a Keys held in a map.
type KeySet map[string]bool

// Has reports whether key is in the set.
func (s KeySet) Has(key string) bool { return s[key] }

// Snapshot is what one claim knows when it plans.
type Snapshot struct {
	// Now is the claim's time: an event whose retryAt is after it is
	// backing off.
	Now time.Time
	// Ordered keeps each key's events in order; without it only paused
	// types are left out.
	Ordered bool
	// Owned marks the partitions the claim may take events of; nil is
	// every partition.
	Owned []bool
	// Events and Bytes bound the batch (Bytes 0: no bound); Ahead bounds
	// the read-ahead (0: none).
	Events, Bytes, Ahead int
	// Held are the keys held for now, whose events stay NEW and unparked:
	// in flight (PROCESSING, a claim write in doubt), or skipped by this
	// worker. The outcome adds the keys the lane holds as it goes.
	Held map[string]bool
	// Failed are the keys a FAILED event holds: their events are parked.
	Failed map[string]bool
	// Parked are the keys with parked events: their events are parked
	// behind them.
	Parked Keys
	// Unparking are the keys whose parked events are being put back in
	// the lane (an unpark written a step at a time): their events are
	// held, neither taken nor parked, until all of them are back. Taken,
	// a later event would go before a parked one; parked, an event put
	// back already would be parked again, for good.
	Unparking Keys
	// Paused are the paused event types: their events are parked.
	Paused map[string]bool
	// WithBackoff says the lane holds events backing off: each holds its
	// key as it comes (it sorts before every later event of its key).
	WithBackoff bool
	// LaneOwned says the database returned only the owned partitions'
	// events (a read that named them, or one partition's read): a
	// misfiled event read is then this claim's to fail.
	LaneOwned bool
	// Stamp asks for the partition of events stored without one.
	Stamp bool
}

// What a plan makes of one event of the lane.
const (
	Take   = iota // into the batch (or the read-ahead, once it is full)
	Skip          // left NEW: another replica's, or held for now
	ParkIt        // parked: out of the lane until its hold is gone
)

// Parked is an event the outcome parks.
type Parked struct {
	Doc    bson.Raw
	Key    string // parkedKey's key: the ordering key, or the type's
	Reason string // events.ParkedPaused or events.ParkedHeld
}

// Outcome is what a claim does with what it read.
type Outcome struct {
	// Batch is what the claim takes, in lane order.
	Batch []bson.Raw
	// Ahead is what it keeps, unclassified, for the next claims of a
	// drain, in lane order: it starts with the event a bound cut.
	Ahead []bson.Raw
	// Park are the events to park, in lane order.
	Park []Parked
	// Stamp are the events read without a stored partition, where asked.
	Stamp []bson.Raw
	// Held are the keys held when the plan stopped: the snapshot's, and
	// those the lane's events held as it went.
	Held map[string]bool
	// More says the batch stopped at a bound.
	More bool
	// Read is how many events the plan classified; Outside says one of
	// them had no stored partition, or one the claim does not trust.
	Read    int
	Outside bool
}

// Planner plans one claim, one event at a time, as the store reads them.
type Planner struct {
	s      Snapshot
	out    Outcome
	bytes  int
	full   bool
	parked map[string]bool // keys this plan parked
	// ByPartition is the partition being read, -1 for a whole read: a
	// whole read's read-ahead keeps the owned partitions' events only.
	byPartition bool
}

// New returns a Planner for s. The outcome's Held starts as a copy of
// s.Held: the planner changes nothing of its snapshot.
func New(s Snapshot) *Planner {
	s.Held = maps.Clone(s.Held)
	if s.Held == nil {
		s.Held = map[string]bool{}
	}
	if s.Parked == nil {
		s.Parked = KeySet(nil)
	}
	if s.Unparking == nil {
		s.Unparking = KeySet(nil)
	}
	return &Planner{s: s, out: Outcome{Held: s.Held}}
}

// ReadingPartition says the events come from one partition's read from
// now on (true) or from a read of the whole lane (false).
func (p *Planner) ReadingPartition(on bool) { p.byPartition = on }

// Plan plans a claim over docs, the lane in claim order.
func Plan(s Snapshot, docs []bson.Raw) Outcome {
	p := New(s)
	for _, d := range docs {
		if p.Step(d) {
			break
		}
	}
	return p.Outcome()
}

// Full reports whether the batch is full: what Step gets is read-ahead.
func (p *Planner) Full() bool { return p.full }

// Outcome is the plan so far.
func (p *Planner) Outcome() Outcome { return p.out }

// Step plans the next event of the lane, and reports whether the plan is
// done (the batch is full and so is the read-ahead).
func (p *Planner) Step(doc bson.Raw) (done bool) {
	if p.full {
		return p.keepAhead(doc)
	}
	if p.Classify(doc) != Take {
		return false
	}
	if len(p.out.Batch) > 0 && p.s.Bytes > 0 && p.bytes+len(doc) > p.s.Bytes {
		// Cut by the byte bound: the event starts the read-ahead, so that
		// no later event of its key is served before it.
		p.out.More, p.full = true, true
		return p.keepAhead(doc)
	}
	p.out.Batch = append(p.out.Batch, doc)
	p.bytes += len(doc)
	if len(p.out.Batch) >= p.s.Events {
		p.out.More, p.full = true, true
		return p.s.Ahead == 0
	}
	return false
}

// keepAhead keeps doc for the next claims, and reports whether the
// read-ahead is full. A whole read's read-ahead leaves out the other
// partitions' events: the claims it serves would skip them.
func (p *Planner) keepAhead(doc bson.Raw) (done bool) {
	if p.s.Ahead == 0 {
		return true
	}
	if !p.byPartition && p.othersPartition(doc) {
		return false
	}
	p.out.Ahead = append(p.out.Ahead, doc)
	return len(p.out.Ahead) >= p.s.Ahead
}

// Classify decides what the claim makes of doc, and notes it: the keys
// it holds, what it parks or stamps. Step calls it for each event until
// the batch is full; a claim served from a read-ahead calls Step on the
// read-ahead's events.
func (p *Planner) Classify(doc bson.Raw) int {
	p.out.Read++
	_, stored, err := events.StoredPartition(doc)
	p.out.Outside = p.out.Outside || err != nil || !stored
	if err == nil {
		err = events.CheckLane(doc)
	}
	if err == nil && !stored && p.s.Stamp {
		// Any replica's: stored, the event leaves this replica's lane.
		p.out.Stamp = append(p.out.Stamp, doc)
	}
	if p.othersPartition(doc) {
		return Skip
	}
	if err != nil {
		// Misfiled (a stored partition not the hash's), or a value that
		// would keep it out of every lane or parked for good: failed by
		// the claim that reads it (events.CheckManaged), whatever holds
		// its key.
		return Take
	}
	key, keyed := events.OrderingKey(doc)
	keyed = keyed && p.s.Ordered
	if p.s.WithBackoff && backingOff(doc, p.s.Now) {
		if keyed {
			p.s.Held[key] = true
		}
		return Skip
	}
	switch typ := typeOf(doc); {
	case p.s.Paused[typ]:
		// Paused: it waits, NEW, and with ordering so does the rest of
		// its aggregate, as behind a FAILED event.
		return p.park(doc, key, keyed, events.ParkedPaused)
	case keyed && (p.s.Failed[key] || p.parked[key] || p.s.Parked.Has(key)):
		return p.park(doc, key, keyed, events.ParkedHeld)
	case keyed && p.s.Unparking.Has(key):
		p.s.Held[key] = true
		return Skip
	case keyed && p.s.Held[key]:
		return Skip
	}
	return Take
}

// othersPartition reports whether doc is another replica's: its
// partition is not owned. A misfiled event (a stored partition not its
// hash's) is the claim's that reads it where the read named the owned
// lanes, or read one partition's: that is the owner of the lane it names.
func (p *Planner) othersPartition(doc bson.Raw) bool {
	owned := p.s.Owned
	if owned == nil {
		return false
	}
	if _, _, err := events.StoredPartition(doc); err != nil {
		return !p.s.LaneOwned && !p.byPartition && !owned[events.Partition(doc)]
	}
	return !owned[events.Partition(doc)]
}

// park parks doc for reason, and holds its key for the rest of the plan.
func (p *Planner) park(doc bson.Raw, key string, keyed bool, reason string) int {
	if keyed {
		p.s.Held[key] = true
		if p.parked == nil {
			p.parked = map[string]bool{}
		}
		p.parked[key] = true
	}
	p.out.Park = append(p.out.Park, Parked{Doc: doc, Key: ParkedKey(doc), Reason: reason})
	return ParkIt
}

// backingOff reports whether doc, a NEW event, waits for a retry still to
// come.
func backingOff(doc bson.Raw, now time.Time) bool {
	retryAt, _ := doc.Lookup(events.FieldRetryAt).TimeOK()
	return events.Held(events.StatusNew, retryAt, false, now, false)
}

func typeOf(doc bson.Raw) string {
	t, _ := doc.Lookup(events.FieldType).StringValueOK()
	return t
}

// UnkeyedPrefix makes the parked key of the events of a type that have
// no ordering key: they hold nothing, and unpark by type.
const UnkeyedPrefix = "\x01unkeyed\x00"

// ParkedKey is the key doc's parked events are known by.
func ParkedKey(doc bson.Raw) string {
	if key, ok := events.OrderingKey(doc); ok {
		return key
	}
	return UnkeyedPrefix + typeOf(doc)
}
