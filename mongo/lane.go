package mongo

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/claim/plan"
	"github.com/outboxrelay/outbox/events"
)

// A claim reads its lane: the NEW events of the partitions it owns that
// are not parked (events.FieldParked), by equality, so that the database
// leaves out what the replica may not take instead of the replica reading
// past it (docs/design.md, The claim's lane). This file keeps the lane: it
// stores the partition of events written without one, parks the events a
// claim meets that must wait, remembers which aggregates have events
// parked, and unparks them once nothing holds them.
//
// A parked event holds its aggregate, as it would at the head: a later
// event of the aggregate that is not parked yet is parked when a claim
// meets it (parkedKeys), never claimed before it.

// parkedReload is how often a store reads again which aggregates of its
// partitions have parked events, beside what its own claims parked: for
// events parked by a worker that owned a partition before, and for a
// parked field a producer wrote itself.
const parkedReload = time.Minute

// unparkChunk bounds the aggregates one unpark step names.
const unparkChunk = 200

// parkedKeys is what a store knows of the parked events of the partitions
// it owns, by ordering key (a key with none is an event without one:
// unkeyedPrefix and its type).
type parkedKeys struct {
	mu   sync.Mutex
	keys map[string]*parkedKey
	// loaded is the tenure each partition's parked events were read
	// under (0: not read): a partition lost and taken again between two
	// claims is read again, since another owner parked in it meanwhile.
	loaded []int64
	// loadedAt is when the last full read began (zero: never).
	loadedAt time.Time
}

// parkedKey is what is parked of one key: the types of its events parked
// because the type is paused, and whether any is parked behind a hold.
type parkedKey struct {
	paused map[string]bool
	held   bool
	// unstamped says that an event of it was parked without a stored
	// partition: unparking it takes a step of its own (noPartition).
	unstamped bool
	// unparking counts the queued unpark steps that still have events of
	// it to put back: until they are written the key holds its later
	// events as if nothing were released, since an earlier event of it
	// is still parked (unparkQueue).
	unparking int
	// doubtUntil is when a park of its events whose write failed can no
	// longer land: it is not released before (inDoubt).
	doubtUntil time.Time
}

// parksNothing reports whether k is known only for its unpark steps.
func (k *parkedKey) parksNothing() bool { return len(k.paused) == 0 && !k.held }

// stillPaused reports whether a type k's events were parked for is paused.
func (k *parkedKey) stillPaused(paused map[string]bool) bool {
	for t := range k.paused {
		if paused[t] {
			return true
		}
	}
	return false
}

// unkeyedPrefix makes the cache key of the parked events of a type that
// have no ordering key: they hold nothing, and unpark by type.
const unkeyedPrefix = plan.UnkeyedPrefix

// parkedView is the keys with parked events, as a claim's plan sees
// them (plan.Snapshot.Parked).
type parkedView struct{ c *parkedKeys }

func (v parkedView) Has(key string) bool { return v.c.holds(key) }

// unparkingView is the keys whose unpark steps are queued, and that have
// nothing parked besides (plan.Snapshot.Unparking).
type unparkingView struct{ c *parkedKeys }

func (v unparkingView) Has(key string) bool {
	v.c.mu.Lock()
	defer v.c.mu.Unlock()
	k := v.c.keys[key]
	return k != nil && k.unparking > 0
}

// holds reports whether key has parked events: a claim parks the later
// events of such a key too.
func (c *parkedKeys) holds(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	k, ok := c.keys[key]
	return ok && !k.parksNothing() && len(key) > 0 && key[0] != unkeyedPrefix[0]
}

// add notes an event of key and type typ parked for reason, with a
// stored partition or not (stamped).
func (c *parkedKeys) add(key, typ, reason string, stamped bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.keys == nil {
		c.keys = map[string]*parkedKey{}
	}
	k := c.keys[key]
	if k == nil {
		k = &parkedKey{paused: map[string]bool{}}
		c.keys[key] = k
	}
	if reason == events.ParkedPaused {
		k.paused[typ] = true
	} else {
		k.held = true
	}
	k.unstamped = k.unstamped || !stamped
}

// stamped reports whether doc has a stored partition.
func stamped(doc bson.Raw) bool {
	_, ok, _ := events.StoredPartition(doc)
	return ok
}

// release is what parkedKeys.released found that nothing holds any more.
type release struct {
	// types are the types resumed, whose events parked for them unpark
	// by type, with the keys of such events (keysOf); held the keys with
	// events parked behind a hold, which unpark by key.
	types, held []string
	keysOf      map[string][]string
	// unstamped are the types and keys above with events parked without
	// a stored partition.
	unstamped map[string]bool
}

// released finds the keys that nothing holds any more: no type of theirs
// is paused, and no FAILED event holds them (failed). It does not forget
// them: each stays held until the unpark steps of its events are written
// (unparking, stepDone), so that a later event of it written meanwhile
// is parked behind them, not claimed before them.
func (c *parkedKeys) released(paused, failed map[string]bool, now time.Time) release {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := release{unstamped: map[string]bool{}, keysOf: map[string][]string{}}
	for key, k := range c.keys {
		if failed[key] || k.stillPaused(paused) || k.parksNothing() || now.Before(k.doubtUntil) {
			continue
		}
		for t := range k.paused {
			r.keysOf[t] = append(r.keysOf[t], key)
			r.unstamped[t] = r.unstamped[t] || k.unstamped
		}
		if k.held {
			r.held = append(r.held, key)
			r.unstamped[key] = k.unstamped
		}
		k.paused, k.held, k.unstamped = map[string]bool{}, false, false
	}
	slices.Sort(r.held)
	r.types = slices.Sorted(maps.Keys(r.keysOf))
	for _, keys := range r.keysOf {
		slices.Sort(keys)
	}
	return r
}

// inDoubt holds keys, whose park's write failed, until until: the write
// may still land, and an unpark written before it would be undone.
func (c *parkedKeys) inDoubt(keys []string, until time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, key := range keys {
		if k := c.keys[key]; k != nil && until.After(k.doubtUntil) {
			k.doubtUntil = until
		}
	}
}

// unparking notes the steps queued to unpark what released returned: each
// key they name stays held until they are written or dropped (stepDone).
func (c *parkedKeys) unparking(steps []unparkStep) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range steps {
		for _, key := range st.keys {
			if k := c.keys[key]; k != nil {
				k.unparking++
			}
		}
	}
}

// stepDone notes that step was written, or dropped: a key whose events
// are all back in its lane, and that nothing parked since, is forgotten.
func (c *parkedKeys) stepDone(step unparkStep) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, key := range step.keys {
		k := c.keys[key]
		if k == nil {
			continue
		}
		k.unparking = max(k.unparking-1, 0)
		if k.unparking == 0 && k.parksNothing() {
			delete(c.keys, key)
		}
	}
}

// toLoad returns the owned partitions whose parked events are not known
// under the tenure held (all of them when the last full read is older
// than parkedReload, and then full), and forgets the keys of the
// partitions no longer owned, or owned under another tenure since.
func (c *parkedKeys) toLoad(owned []bool, tenures []int64, now time.Time) (ps []int, full bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.loaded == nil || now.Sub(c.loadedAt) >= parkedReload {
		// What is parked is read again, and unparked anew: the queued
		// steps of what is read go too (Store.loadParked). A key whose
		// park is in doubt stays, held, until that park cannot land:
		// the read may come before it.
		c.loaded, c.loadedAt, full = make([]int64, events.Partitions), now, true
		maps.DeleteFunc(c.keys, func(_ string, k *parkedKey) bool {
			k.unparking = 0
			return !now.Before(k.doubtUntil)
		})
	}
	for p := range events.Partitions {
		mine := owned == nil || owned[p]
		if mine && c.loaded[p] == tenureOf(tenures, p) || !mine && c.loaded[p] == 0 {
			continue
		}
		if c.loaded[p] != 0 {
			c.loaded[p] = 0
			for key := range c.keys {
				if partitionOfKey(key) == p {
					delete(c.keys, key)
				}
			}
		}
		if mine {
			ps = append(ps, p)
		}
	}
	return ps, full
}

// tenureOf is the tenure partition p is held under: 1 without tenures.
func tenureOf(tenures []int64, p int) int64 {
	if p < len(tenures) && tenures[p] != 0 {
		return tenures[p]
	}
	return 1
}

func (c *parkedKeys) markLoaded(ps []int, tenures []int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range ps {
		c.loaded[p] = tenureOf(tenures, p)
	}
}

// partitionOfKey is the partition of a cache key's events; -1 for the
// events without a key, which spread over every partition.
func partitionOfKey(key string) int {
	if len(key) > 0 && key[0] == unkeyedPrefix[0] {
		return -1
	}
	return events.PartitionOf(key)
}

// loadParked reads which aggregates of the owned partitions not known yet
// have parked events: one projected find, on the lane index on MongoDB.
// full reports a full read (every parkedReload), when the claim also looks
// for misfiled events.
func (s *Store) loadParked(ctx context.Context, owned []bool, tenures []int64, now time.Time) (full bool, err error) {
	ps, full := s.parked.toLoad(owned, tenures, now)
	if len(ps) == 0 {
		return full, nil
	}
	s.unparking.dropPartitions(ps)
	// A dropped step may have been in doubt, and land after a read-ahead
	// was read: the next claims read the lane again.
	s.ahead.drop()
	filter := bson.D{
		{Key: events.FieldStatus, Value: events.StatusNew},
		{Key: events.FieldParked, Value: true},
	}
	if len(ps) < events.Partitions {
		// null too: an event parked before its partition was stored
		// (the stamp write failed) must not wait for good.
		if in, ok := s.lane.inPartitions(ps); ok {
			filter = append(filter, in)
		}
	}
	proj := options.Find().SetProjection(bson.D{
		{Key: events.FieldAggregateType, Value: 1}, {Key: events.FieldAggregateID, Value: 1},
		{Key: events.FieldType, Value: 1}, {Key: events.FieldParkedFor, Value: 1},
		{Key: events.FieldPartition, Value: 1},
	}).SetBatchSize(heldBatch)
	cur, err := s.coll.Find(ctx, filter, proj)
	if err != nil {
		return full, fmt.Errorf("find parked events: %w", err)
	}
	defer closeCursor(ctx, cur)
	want := make([]bool, events.Partitions)
	for _, p := range ps {
		want[p] = true
	}
	for cur.Next(ctx) {
		if p := events.Partition(cur.Current); want[p] {
			reason, _ := cur.Current.Lookup(events.FieldParkedFor).StringValueOK()
			s.parked.add(plan.ParkedKey(cur.Current), typeOf(cur.Current), reason, stamped(cur.Current))
		}
	}
	if err := cur.Err(); err != nil {
		return full, fmt.Errorf("read parked events: %w", err)
	}
	s.parked.markLoaded(ps, tenures)
	return full, nil
}

// misfiledMax bounds the misfiled events one claim reads.
const misfiledMax = 100

// misfiled reads NEW events that no claim's lane reads: a stored
// partition no lane names (not a whole number from 0 to Partitions-1), or
// a parked other than true (outside the lane's parked: null, and never
// unparked). The claim that looks for them fails them
// (events.CheckManaged). Two finds on the lane index, every parkedReload,
// on MongoDB only: FerretDB's claims read by status and parked: {$ne:
// true}, and meet them at the head.
func (s *Store) misfiled(ctx context.Context) ([]bson.Raw, error) {
	var docs []bson.Raw
	for _, filter := range []bson.D{{
		{Key: events.FieldStatus, Value: events.StatusNew},
		{Key: events.FieldParked, Value: nil},
		{Key: events.FieldPartition, Value: bson.D{{Key: "$nin", Value: lanePartitions(nil)}}},
	}, {
		{Key: events.FieldStatus, Value: events.StatusNew},
		{Key: events.FieldParked, Value: bson.D{{Key: "$nin", Value: bson.A{nil, true}}}},
	}} {
		cur, err := s.coll.Find(ctx, filter, options.Find().SetLimit(misfiledMax).SetHint(laneIndex))
		if err != nil {
			return nil, fmt.Errorf("find misfiled events: %w", err)
		}
		var found []bson.Raw
		if err := cur.All(ctx, &found); err != nil {
			return nil, fmt.Errorf("read misfiled events: %w", err)
		}
		docs = append(docs, found...)
	}
	return docs, nil
}

// ownedList lists the partitions owned marks, nil for every partition.
func ownedList(owned []bool) []int {
	if owned == nil {
		return nil
	}
	var ps []int
	for p, o := range owned {
		if o {
			ps = append(ps, p)
		}
	}
	return ps
}
