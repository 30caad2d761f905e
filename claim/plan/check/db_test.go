package check

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
)

const (
	statusNew        = string(events.StatusNew)
	statusProcessing = string(events.StatusProcessing)
	statusPublished  = string(events.StatusPublished)
	statusFailed     = string(events.StatusFailed)
)

// base is the time simulated millisecond 0 stands for.
var base = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func timeOf(t ms) time.Time { return base.Add(time.Duration(t) * time.Millisecond) }

// doc is one outbox document. A FerretDB rewrite replaces all of its
// fields from a copy read earlier; m, the oracle's notes, is a pointer
// that the copy shares, so a rewrite never undoes what the oracle saw.
type doc struct {
	id, typ, aggType, aggID string
	key                     string // ordering key; "" for none
	createdAt               ms
	partition               int
	pad                     int
	status                  string
	parked                  bool
	parkedFor               string
	worker                  int // -1: none
	token                   int64
	processingAt, retryAt   ms // on the writer's clock; retryAt 0: none
	attempts                int
	skipped                 bool
	lastError               string
	failedAt                ms
	raw                     bson.Raw // nil after a change: encode builds it
	m                       *meta
}

// encode is d as a claim reads it: the fields the plan looks at, and a
// pad that gives it its size.
func (d *doc) encode() bson.Raw {
	if d.raw != nil {
		return d.raw
	}
	e := bson.D{
		{Key: events.FieldID, Value: d.id},
		{Key: events.FieldType, Value: d.typ},
		{Key: events.FieldStatus, Value: d.status},
		{Key: events.FieldCreatedAt, Value: timeOf(d.createdAt)},
	}
	if d.aggID != "" {
		e = append(e, bson.E{Key: events.FieldAggregateType, Value: d.aggType},
			bson.E{Key: events.FieldAggregateID, Value: d.aggID})
	}
	if d.retryAt != 0 {
		e = append(e, bson.E{Key: events.FieldRetryAt, Value: timeOf(d.retryAt)})
	}
	if d.partition >= 0 {
		e = append(e, bson.E{Key: events.FieldPartition, Value: int32(d.partition)})
	}
	e = append(e, bson.E{Key: "payload", Value: strings.Repeat("x", d.pad)})
	raw, err := bson.Marshal(e)
	if err != nil {
		panic(err)
	}
	d.raw = raw
	return raw
}

// db is the simulated outbox: its documents in claim order (createdAt,
// then _id: inserts come in that order), and the paused types.
type db struct {
	s      *sim
	docs   []*doc
	byID   map[string]*doc
	paused map[string]ms // type -> since when
}

func newDB(s *sim) *db { return &db{s: s, byID: map[string]*doc{}, paused: map[string]ms{}} }

// insert writes a new event, as a producer's transaction does: createdAt
// is now, the _id the next in order, the partition stored.
func (db *db) insert(agg int, keyed bool, typ string, pad int) {
	n := len(db.docs)
	d := &doc{id: fmt.Sprintf("e%05d", n), typ: typ, createdAt: db.s.now, partition: -1,
		pad: pad, status: statusNew, worker: -1, m: &meta{}}
	// The partition as the producer helper stores it (events.Partition):
	// the key's, or the _id's for an event without one.
	d.partition = events.PartitionOf(d.id)
	if keyed {
		d.aggType, d.aggID = []string{"order", "cart"}[agg%2], fmt.Sprint("a", agg)
		d.key = events.Key(d.aggType, d.aggID)
		d.partition = events.PartitionOf(d.key)
	}
	if p := events.Partition(d.encode()); p != d.partition {
		panic(fmt.Sprintf("partition %d, events.Partition says %d", d.partition, p))
	}
	db.docs = append(db.docs, d)
	db.byID[d.id] = d
	db.s.or.inserted(d)
	db.s.tracef(d.aggID, "insert %s", describe(d))
}

// update is a write: the documents it matches (among ids when set) get
// set. A lane write (claim, park, unpark) is checked against the
// ownership table as it lands: no replica may change a partition's lane
// outside its term.
type update struct {
	name  string
	ids   []string
	match func(*doc) bool
	set   func(*doc)
	lane  *replica
	terms []int64 // the writer's terms, by partition, when it sent it
}

// candidates are the documents u may match.
func (db *db) candidates(u *update) []*doc {
	if u.ids == nil {
		return db.docs
	}
	out := make([]*doc, 0, len(u.ids))
	for _, id := range u.ids {
		if d := db.byID[id]; d != nil {
			out = append(out, d)
		}
	}
	return out
}

// update runs u until end and replies with the _ids it changed. On
// MongoDB each document's match and change are one atomic step, run
// after the server's delay if that is within end. On FerretDB the
// command reads the matching documents first and rewrites each whole
// document later from what it read: other commands run in between, two
// racers can both win, and a late rewrite undoes what landed meanwhile.
func (db *db) update(u *update, end ms, reply func(any)) {
	s := db.s
	if !s.cfg.ferret {
		s.after(s.execDelay(), nil, func() {
			if s.now > end {
				reply(errTimeout{})
				return
			}
			var won []string
			for _, d := range db.candidates(u) {
				if u.match(d) {
					u.set(d)
					d.raw = nil
					db.wrote(u, d)
					db.traceWrite(u, d)
					won = append(won, d.id)
				}
			}
			reply(won)
		})
		return
	}
	var read []doc
	for _, d := range db.candidates(u) {
		if u.match(d) {
			read = append(read, *d)
		}
	}
	s.after(s.execDelay(), nil, func() {
		if s.now > end {
			reply(errTimeout{})
			return
		}
		won := make([]string, 0, len(read))
		for _, c := range read {
			u.set(&c)
			c.raw = nil
			d := db.byID[c.id]
			*d = c
			db.wrote(u, d)
			db.traceWrite(u, d)
			won = append(won, c.id)
		}
		reply(won)
	})
}

func (db *db) traceWrite(u *update, d *doc) {
	by := -1
	if u.lane != nil {
		by = u.lane.id
	}
	db.s.tracef(d.aggID, "%s by replica %d: %s worker %d token %d retryAt %d", u.name, by, describe(d), d.worker, d.token, d.retryAt)
}

// wrote checks a lane write as it changes d: the writer must hold d's
// partition under the term it wrote with.
func (db *db) wrote(u *update, d *doc) {
	if u.lane == nil {
		return
	}
	o := db.s.own[d.partition]
	if o.replica != u.lane.id || o.term != u.terms[d.partition] {
		db.s.fail(fmt.Sprintf("replica %d's %s wrote %s outside its term %d (partition held by replica %d under term %d)",
			u.lane.id, u.name, describe(d), u.terms[d.partition], o.replica, o.term))
	}
}

// lane is a claim's find: the NEW events not parked, in claim order; on
// MongoDB only the owned partitions' and those due (retryAt not after
// now), on FerretDB the whole lane, backing off or not.
func (db *db) lane(owned []bool, now ms) []bson.Raw {
	var out []bson.Raw
	for _, d := range db.docs {
		if d.status != statusNew || d.parked {
			continue
		}
		if !db.s.cfg.ferret && (!owned[d.partition] || d.retryAt > now) {
			continue
		}
		out = append(out, d.encode())
	}
	return out
}

// holds are the keys held at now (events.Held): PROCESSING, FAILED and
// not skipped (failed, with failedHolds), and on MongoDB backing off.
type holds struct{ held, failed map[string]bool }

func (db *db) holds(now ms) holds {
	h := holds{held: map[string]bool{}, failed: map[string]bool{}}
	for _, d := range db.docs {
		if d.key == "" {
			continue
		}
		switch {
		case d.status == statusProcessing:
			h.held[d.key] = true
		case d.status == statusFailed && !d.skipped && db.s.cfg.failedHolds:
			h.held[d.key], h.failed[d.key] = true, true
		case d.status == statusNew && !db.s.cfg.ferret && d.retryAt > now:
			h.held[d.key] = true
		}
	}
	return h
}

// parkedIn are the parked events of partitions ps (loadParked).
func (db *db) parkedIn(ps []bool) []*doc {
	var out []*doc
	for _, d := range db.docs {
		if d.status == statusNew && d.parked && ps[d.partition] {
			c := *d
			out = append(out, &c)
		}
	}
	return out
}

func (db *db) pausedTypes() []string {
	var ts []string
	for _, t := range types {
		if _, ok := db.paused[t]; ok {
			ts = append(ts, t)
		}
	}
	return ts
}

func (db *db) pause(t string) {
	if _, ok := db.paused[t]; !ok {
		db.paused[t] = db.s.now
	}
}

func (db *db) resume(t string) { delete(db.paused, t) }

// requeue puts a FAILED event back to NEW, as an operator does.
func (db *db) requeue(target *doc) {
	db.update(&update{name: "requeue", ids: []string{target.id},
		match: func(d *doc) bool { return d.status == statusFailed },
		set: func(d *doc) {
			d.status, d.attempts, d.lastError, d.skipped, d.retryAt = statusNew, 0, "", false, 0
			d.parked, d.parkedFor = false, ""
			d.m.requeuedAt = db.s.now
		},
	}, db.s.now+1000, func(any) {})
}

// skip marks a FAILED event skipped: it holds its aggregate no more.
func (db *db) skip(target *doc) {
	db.update(&update{name: "skip", ids: []string{target.id},
		match: func(d *doc) bool { return d.status == statusFailed && !d.skipped },
		set:   func(d *doc) { d.skipped, d.m.skipped = true, true },
	}, db.s.now+1000, func(any) {})
}

// allDone reports whether every event is PUBLISHED or FAILED.
func (db *db) allDone() bool {
	return !slices.ContainsFunc(db.docs, func(d *doc) bool {
		return d.status != statusPublished && d.status != statusFailed
	})
}
