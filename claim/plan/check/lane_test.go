package check

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/claim/plan"
	"github.com/outboxrelay/outbox/events"
)

// readLane serves the claim from the read-ahead, or reads the lane and
// plans over it.
func (r *replica) readLane(c *claim) {
	c.terms = r.liveTerms()
	c.owned = make([]bool, partitions)
	for p, t := range c.terms {
		c.owned[p] = t != 0 && r.loaded[p]
	}
	now := c.now
	if out, ok := r.fromAhead(c, now); ok {
		r.park(c, out)
		return
	}
	r.s.call(r, r.s.cfg.budget, func(_ ms, reply func(any)) { reply(r.s.db.lane(c.owned, now)) },
		func(res any, ok bool) {
			if !ok {
				r.ahead.drop()
				r.draining = false
				r.next(10)
				return
			}
			p := plan.New(r.snapshot(c, now, r.s.cfg.batch*r.s.cfg.aheadBatches))
			docs := res.([]bson.Raw)
			ended := true
			for _, d := range docs {
				if p.Step(d) {
					ended = false
					break
				}
			}
			out := p.Outcome()
			r.tracePlan("lane", docs, out)
			out.Ahead = r.byteCut(out)
			r.ahead.put(aheadPage{docs: out.Ahead, held: out.Held, readAt: now, at: r.s.now, ended: ended}, c.owned, c.terms)
			r.park(c, out)
		}, nil)
}

// byteCut counts a byte cut with a later event of the cut event's key
// in the read-ahead, and with the knob DropByteCut drops the cut event
// (hole 1: the store kept page.docs[i+1:]).
func (r *replica) byteCut(out plan.Outcome) []bson.Raw {
	if !out.More || len(out.Batch) >= r.s.cfg.batch || len(out.Ahead) == 0 {
		return out.Ahead
	}
	if key, ok := events.OrderingKey(out.Ahead[0]); ok {
		for _, d := range out.Ahead[1:] {
			if k, _ := events.OrderingKey(d); k == key {
				r.s.c.ByteCutAhead++
				break
			}
		}
	}
	if r.s.knobs.DropByteCut {
		return out.Ahead[1:]
	}
	return out.Ahead
}

// snapshot is what the plan gets: the holds read and those of the
// replica's own claims in flight or in doubt, the paused types, the
// parked-keys cache, the owned partitions, the limits.
func (r *replica) snapshot(c *claim, now ms, ahead int) plan.Snapshot {
	held := map[string]bool{}
	for k := range c.holds.held {
		held[k] = true
	}
	for k := range r.held {
		held[k] = true
	}
	return plan.Snapshot{
		Now: timeOf(now), Ordered: true, Owned: c.owned,
		Events: r.s.cfg.batch, Bytes: r.s.cfg.bytes, Ahead: ahead,
		Held: held, Failed: c.holds.failed, Parked: &r.cache, Paused: c.paused,
		Unparking:   unparkingView{&r.cache},
		WithBackoff: r.s.cfg.ferret, LaneOwned: !r.s.cfg.ferret,
	}
}

// fromAhead is mongo/ahead.go's fromAhead over the model's page.
func (r *replica) fromAhead(c *claim, now ms) (plan.Outcome, bool) {
	page, fits := r.ahead.take(c.owned, c.terms, now, r.draining)
	if !fits || page.at < r.aheadNotBefore {
		return plan.Outcome{}, false
	}
	snap := r.snapshot(c, now, 0)
	for k := range page.held {
		snap.Held[k] = true
	}
	p := plan.New(snap)
	for i, d := range page.docs {
		taken := len(p.Outcome().Batch)
		if p.Step(d) {
			if len(p.Outcome().Batch) == taken {
				i-- // cut by a bound: it starts what is left
			}
			page.docs, page.held = page.docs[i+1:], p.Outcome().Held
			r.ahead.put(page, c.owned, c.terms)
			r.tracePlan("read-ahead", nil, p.Outcome())
			return p.Outcome(), true
		}
	}
	if page.ended {
		r.tracePlan("read-ahead (ended)", nil, p.Outcome())
	}
	return p.Outcome(), page.ended
}

// tracePlan tells what a plan made of the traced aggregate's events.
func (r *replica) tracePlan(from string, read []bson.Raw, out plan.Outcome) {
	if r.s.traceAgg == "" {
		return
	}
	ids := func(docs []bson.Raw) []string {
		var out []string
		for _, d := range docs {
			if a, _ := d.Lookup(events.FieldAggregateID).StringValueOK(); a == r.s.traceAgg {
				out = append(out, idOf(d))
			}
		}
		return out
	}
	var parked []bson.Raw
	for _, p := range out.Park {
		parked = append(parked, p.Doc)
	}
	key := ""
	if d := r.s.or.byKey; d != nil {
		for k := range d {
			if strings.HasSuffix(k, "\x00"+r.s.traceAgg) {
				key = k
			}
		}
	}
	r.s.tracef(r.s.traceAgg, "replica %d plans from %s: read %v batch %v ahead %v park %v; held %v cached %v unparking %v local %d",
		r.id, from, ids(read), ids(out.Batch), ids(out.Ahead), ids(parked), out.Held[key], r.cache.Has(key),
		unparkingView{&r.cache}.Has(key), r.held[key])
}
