package check

import (
	"maps"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/claim/plan"
	"github.com/outboxrelay/outbox/events"
)

// parks are one claim's park writes: the _ids by reason, and the
// partitions they lie in.
type parks struct {
	ids  map[string][]string
	ps   map[string][]int
	keys map[string][]string
}

// park notes what the plan parks in the cache, then writes the parks
// before the claim (within the term, as the claim's writes), or with the
// knob LatePark after it, unguarded (hole 4).
func (r *replica) park(c *claim, out plan.Outcome) {
	pk := parks{ids: map[string][]string{}, ps: map[string][]int{}, keys: map[string][]string{}}
	for _, p := range out.Park {
		typ, _ := p.Doc.Lookup(events.FieldType).StringValueOK()
		r.cache.add(p.Key, typ, p.Reason)
		pk.ids[p.Reason] = append(pk.ids[p.Reason], idOf(p.Doc))
		pk.ps[p.Reason] = append(pk.ps[p.Reason], events.Partition(p.Doc))
		pk.keys[p.Reason] = append(pk.keys[p.Reason], p.Key)
	}
	if r.s.knobs.LatePark {
		r.writeClaim(c, out, func() {
			r.s.after(r.s.between(0, 1500), r, func() { r.writeParks(c, pk, true, func() {}) })
		})
		return
	}
	r.writeParks(c, pk, false, func() { r.writeClaim(c, out, func() {}) })
}

// writeParks writes the parks one reason at a time, then calls then. A
// park that fails or cannot be sent is left: the next claim that reads
// the event parks it again.
func (r *replica) writeParks(c *claim, pk parks, unguarded bool, then func()) {
	reasons := slices.Sorted(maps.Keys(pk.ids))
	var step func(i int)
	step = func(i int) {
		if i == len(reasons) {
			then()
			return
		}
		reason := reasons[i]
		u := &update{name: "park", ids: pk.ids[reason],
			match: func(d *doc) bool { return d.status == statusNew && !d.parked },
			set:   func(d *doc) { d.parked, d.parkedFor = true, reason },
		}
		ps := slices.Compact(slices.Sorted(slices.Values(pk.ps[reason])))
		keys := pk.keys[reason]
		sent := r.sendLane(u, ps, c.terms, unguarded, func(_ any, ok bool) {
			// Answered, it can land no more; in doubt, not until its end.
			if ok {
				r.landed(keys)
			} else {
				r.s.at(r.parkEnd[ps[0]], r, func() { r.landed(keys) })
			}
			step(i + 1)
		}, nil)
		if !sent {
			step(i + 1)
			return
		}
		for _, k := range keys {
			r.cache.landing[k]++
		}
	}
	step(0)
}

// writeClaim claims the batch in one write guarded by status NEW and not
// parked, then hands what it won to the publisher. A write whose reply
// does not come is in doubt: its keys stay held until a release after
// the write can land no more.
func (r *replica) writeClaim(c *claim, out plan.Outcome, then func()) {
	r.draining = out.More
	batch := out.Batch
	r.ahead.expect(len(batch))
	r.ahead.confirm(len(batch))
	if len(batch) == 0 {
		then()
		r.next(r.s.between(20, 100))
		return
	}
	ids, keys := make([]string, len(batch)), keysOf(batch)
	var ps []int
	for i, d := range batch {
		ids[i] = idOf(d)
		ps = append(ps, events.Partition(d))
	}
	ps = slices.Compact(slices.Sorted(slices.Values(ps)))
	r.tokens++
	token, at := r.tokens, r.clock()
	u := &update{name: "claim", ids: ids,
		match: func(d *doc) bool { return d.status == statusNew && !d.parked },
		set: func(d *doc) {
			d.status, d.worker, d.token, d.processingAt = statusProcessing, r.id, token, at
			d.attempts++
			d.retryAt = 0
		},
	}
	late := func(res any) {
		if won, ok := res.([]string); ok && len(won) > 0 {
			r.s.c.LateClaimReply++
		}
	}
	sent := r.sendLane(u, ps, c.terms, false, func(res any, ok bool) {
		defer then()
		if !ok {
			r.doubts = append(r.doubts, &doubt{token: token, keys: keys,
				end: r.s.now + r.s.cfg.netMax + r.s.cfg.budget})
			r.hold(keys)
			r.draining = false
			r.next(1)
			return
		}
		won := res.([]string)
		if len(won) != len(ids) {
			r.ahead.drop()
		}
		// An event lost to another write holds its key (the store since
		// the fix of a straggling claim): what the claim won behind it goes
		// back unpublished. With the knob PartialClaim it is published.
		var docs []*doc
		lost, behind := map[string]bool{}, map[int]bool{}
		for _, id := range ids {
			d := r.s.db.byID[id]
			if !slices.Contains(won, id) {
				lost[d.key] = d.key != ""
				continue
			}
			if lost[d.key] {
				r.s.c.WonBehindLost++
				behind[len(docs)] = !r.s.knobs.PartialClaim
			}
			docs = append(docs, d)
		}
		if len(docs) > 0 {
			b := &pubBatch{docs: docs, token: token, pausedAt: c.pausedAt, heldAt: c.heldAt, claimedAt: r.s.now, behind: behind}
			for _, d := range docs {
				if d.key != "" {
					b.keys = append(b.keys, d.key)
				}
			}
			r.hold(b.keys)
			r.pub.enqueue(b)
		}
		r.next(1)
	}, late)
	if !sent {
		r.ahead.drop()
		r.draining = false
		then()
		r.next(10)
	}
}

// landed notes that a park write of keys can land no more.
func (r *replica) landed(keys []string) {
	for _, k := range keys {
		if r.cache.landing[k]--; r.cache.landing[k] <= 0 {
			delete(r.cache.landing, k)
		}
	}
}

func idOf(d bson.Raw) string {
	id, _ := d.Lookup(events.FieldID).StringValueOK()
	return id
}

func keysOf(docs []bson.Raw) []string {
	var keys []string
	for _, d := range docs {
		if k, ok := events.OrderingKey(d); ok {
			keys = append(keys, k)
		}
	}
	return keys
}
