package check

import (
	"fmt"
	"hash/fnv"
	"slices"

	"github.com/outboxrelay/outbox/events"
)

// meta is what the oracle notes of an event, beside the document (a
// FerretDB rewrite never undoes it).
type meta struct {
	delivered, confirmed bool
	requeuedAt           ms
	skipped              bool // ever skipped by an operator
}

// oracle checks the promise, not the mechanism: it knows what was
// written, what the broker delivered, what operators did and when, and
// (for the term check, in db.wrote) the ownership table.
type oracle struct {
	s         *sim
	byKey     map[string][]*doc // each key's events in claim order
	delivered int
	order     []string // first deliveries, in order
}

func newOracle(s *sim) *oracle { return &oracle{s: s, byKey: map[string][]*doc{}} }

// inserted notes a new event, and counts it if it arrives while the
// owner of its partition has an unpark step queued that would unpark an
// earlier event of its key: a resume (or requeue) with new events
// arriving during the unpark.
func (o *oracle) inserted(d *doc) {
	if d.key == "" {
		return
	}
	earlier := o.byKey[d.key]
	o.byKey[d.key] = append(earlier, d)
	ow := o.s.own[d.partition]
	if ow.replica < 0 {
		return
	}
	for _, st := range o.s.reps[ow.replica].unparks {
		if st.p != d.partition {
			continue
		}
		if slices.Contains(st.keys, d.key) || !st.held && slices.ContainsFunc(earlier, func(e *doc) bool {
			return e.status == statusNew && e.parked && e.parkedFor == events.ParkedPaused && e.typ == st.typ
		}) {
			o.s.c.ResumeDuringUnpark++
			return
		}
	}
}

// deliver checks a delivery by the broker of d, claimed by b. A first
// delivery must come after the first delivery of every earlier event of
// its key, unless that one is FAILED (and, where FAILED events hold,
// skipped or failed after b's claim read the holds), or an operator
// requeued it after that read. Nothing is published of a type paused
// since before b's claim read the paused types.
func (o *oracle) deliver(d *doc, b *pubBatch) {
	if d.m.delivered {
		return
	}
	d.m.delivered = true
	o.delivered++
	o.s.tracef(d.aggID, "delivered %s (token %d, paused read at %d, holds at %d)", d.id, b.token, b.pausedAt, b.heldAt)
	o.order = append(o.order, d.id)
	s := o.s
	if since, ok := s.db.paused[d.typ]; ok && since < b.pausedAt {
		s.fail(fmt.Sprintf("published %s while its type was paused (since %d; the claim read the paused types at %d)",
			describe(d), since, b.pausedAt))
	}
	if d.key == "" {
		return
	}
	for _, e := range o.byKey[d.key] {
		if e == d {
			return
		}
		// A FAILED event that held nothing (skipped, or FailedHolds off)
		// lets what came after it go first even once an operator requeues
		// it: the read-ahead, the model's as the store's, keeps no hold
		// for it (an open question of semantics, not checked here).
		if e.m.delivered || e.m.requeuedAt > b.heldAt || (!s.cfg.failedHolds || e.m.skipped) && e.m.requeuedAt > 0 {
			continue
		}
		if e.status == statusFailed {
			if s.cfg.failedHolds && !e.skipped && e.failedAt < b.heldAt {
				s.fail(fmt.Sprintf("first delivery of %s passed %s, FAILED since %d and holding its aggregate (holds read at %d)",
					describe(d), describe(e), e.failedAt, b.heldAt))
			}
			continue
		}
		s.fail(fmt.Sprintf("first delivery of %s (claimed by token %d, holds read at %d) before the earlier %s of its aggregate, never delivered",
			describe(d), b.token, b.heldAt, describe(e)))
		return
	}
}

// final checks, after the drain, that nothing NEW was lost: every event
// is PUBLISHED after a confirm, or FAILED with a reason.
func (o *oracle) final() {
	for _, d := range o.s.db.docs {
		switch {
		case d.status == statusPublished && (!d.m.delivered || !d.m.confirmed):
			o.s.fail("PUBLISHED without a confirmed delivery: " + describe(d))
		case d.status == statusFailed && d.lastError == "":
			o.s.fail("FAILED without a reason: " + describe(d))
		case d.status != statusPublished && d.status != statusFailed:
			o.s.fail("lost: after the drain " + describe(d))
		}
		if o.s.violation != "" {
			return
		}
	}
	if len(o.s.db.docs) != o.s.cfg.events {
		o.s.fail(fmt.Sprintf("the producers wrote %d events of %d", len(o.s.db.docs), o.s.cfg.events))
	}
}

// fingerprint hashes the first deliveries' order, the final states and
// the commands run.
func (o *oracle) fingerprint() uint64 {
	h := fnv.New64a()
	for _, id := range o.order {
		h.Write([]byte(id))
	}
	for _, d := range o.s.db.docs {
		h.Write([]byte(d.status))
	}
	fmt.Fprint(h, o.s.ops, o.s.now)
	return h.Sum64()
}
