package mongo

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
)

// Unparking puts back in their lane the parked events that nothing holds
// any more (parkedKeys.released): those parked for a resumed type, by
// type, and those parked behind a hold, by key. A resume can release tens
// of thousands of events at once, and one write of them all outlasted
// every claim's time on FerretDB (it rewrites each document, about 1,500 a
// second), was given up, and was written again a minute later by every
// replica, each its own claim's time: a timeout that fed on itself. So an
// unpark is cut into steps, each one partition's events (an equality
// FerretDB pushes down, the lane index's prefix on MongoDB), and each claim
// writes the steps its share of time allows (unparkShare), in order; the
// rest wait for the next claim. A step that fails stays first in line.

// unparkShare is the share of a claim's time its unpark steps may take
// before its read: a third, as much as a read by partition reads for.
const (
	unparkShareNum = 1
	unparkShareDen = 3
)

// unparkStep is one write of an unpark: the parked events of one
// partition (noPartition: those parked without a stored partition) that
// filter selects.
type unparkStep struct {
	what      string
	partition int
	filter    bson.D
	// keys are the parked keys whose events this step puts back, which
	// hold until it is written (parkedKeys.stepDone).
	keys []string
	// inDoubt says an earlier write of it failed, and may have landed
	// since: its retry moving nothing does not mean nothing moved.
	inDoubt bool
}

// noPartition is the partition of a step that unparks the events parked
// without a stored partition (written by a producer that stores none, and
// parked by a claim that did not store it: FerretDB's).
const noPartition = -1

// unparkQueue is the steps a store has still to write, oldest first.
type unparkQueue struct {
	mu    sync.Mutex
	steps []unparkStep
}

// len is how many steps are queued.
func (q *unparkQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.steps)
}

func (q *unparkQueue) add(steps []unparkStep) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.steps = append(q.steps, steps...)
}

// next returns the first step, and false when there is none.
func (q *unparkQueue) next() (unparkStep, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.steps) == 0 {
		return unparkStep{}, false
	}
	return q.steps[0], true
}

// dropPartitions drops the steps in partitions ps: their parked events
// are being read again (parkedKeys.toLoad), and a claim unparks what it
// finds anew, with the keys it names as they are now.
func (q *unparkQueue) dropPartitions(ps []int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.steps = slices.DeleteFunc(q.steps, func(st unparkStep) bool { return slices.Contains(ps, st.partition) })
}

// doubt marks the first step's write as failed, perhaps landing later.
func (q *unparkQueue) doubt() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.steps) > 0 {
		q.steps[0].inDoubt = true
	}
}

// done drops the first step, once written.
func (q *unparkQueue) done() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.steps = q.steps[1:]
}

// unparkSteps cuts what r released into steps in the partitions owned
// (every partition when nil): a resumed type is a step per partition, the
// held keys a step per partition and unparkChunk keys, and what was
// parked without a stored partition a step of its own.
func unparkSteps(owned []bool, r release) []unparkStep {
	var steps []unparkStep
	for _, typ := range r.types {
		filter := bson.D{{Key: events.FieldParkedFor, Value: events.ParkedPaused}, {Key: events.FieldType, Value: typ}}
		keysIn := map[int][]string{}
		for _, key := range r.keysOf[typ] {
			keysIn[partitionOfKey(key)] = append(keysIn[partitionOfKey(key)], key)
		}
		for _, p := range partitionsOf(owned) {
			steps = append(steps, unparkStep{what: "the events of type " + typ, partition: p, filter: filter, keys: keysIn[p]})
		}
		if r.unstamped[typ] {
			// Every key of the type may have an event parked without a
			// stored partition: each holds until this step too.
			steps = append(steps, unparkStep{what: "the events of type " + typ, partition: noPartition, filter: filter, keys: r.keysOf[typ]})
		}
	}
	byPartition := map[int][]string{}
	for _, key := range r.held {
		p := partitionOfKey(key)
		if p == noPartition {
			// A key without an aggregate parked as held (by hand):
			// its events spread over every partition.
			for _, p := range partitionsOf(owned) {
				byPartition[p] = append(byPartition[p], key)
			}
		} else {
			byPartition[p] = append(byPartition[p], key)
		}
		if r.unstamped[key] || p == noPartition {
			byPartition[noPartition] = append(byPartition[noPartition], key)
		}
	}
	for _, p := range slices.Sorted(maps.Keys(byPartition)) {
		for chunk := range slices.Chunk(byPartition[p], unparkChunk) {
			var or bson.A
			for _, key := range chunk {
				or = append(or, keyFilter(key))
			}
			steps = append(steps, unparkStep{
				what: fmt.Sprintf("the events of %d aggregates", len(chunk)), partition: p,
				filter: bson.D{{Key: "$or", Value: or}}, keys: chunk,
			})
		}
	}
	return steps
}

// partitionsOf lists the partitions owned marks, every one when nil.
func partitionsOf(owned []bool) []int {
	var ps []int
	for p := range events.Partitions {
		if owned == nil || owned[p] {
			ps = append(ps, p)
		}
	}
	return ps
}

// unparkReleased queues the unpark of what nothing holds any more (a
// type resumed, a FAILED event requeued or skipped), then writes the
// queued steps for its share of ctx's time.
func (s *Store) unparkReleased(ctx context.Context, owned []bool, paused, failed map[string]bool) {
	if r := s.parked.released(paused, failed, time.Now()); len(r.types) > 0 || len(r.held) > 0 {
		steps := unparkSteps(owned, r)
		s.parked.unparking(steps)
		s.unparking.add(steps)
	}
	n, err := s.unpark(ctx, owned)
	if err != nil {
		s.logger.Warn("could not unpark events; the next claim goes on", "error", err)
	}
	if n > 0 {
		s.ahead.drop() // what it unparked may sort before a read-ahead's
		s.partitionReads.probeNow()
		s.logger.Debug("unparked events", "events", n)
	}
}

// unpark writes the queued steps, in order, until its share of ctx's
// time is spent (one step at least), and returns how many events it
// moved. A step in a partition no longer owned is dropped: the
// partition's owner reads its parked events again, and unparks them
// itself.
func (s *Store) unpark(ctx context.Context, owned []bool) (int, error) {
	stop, hasStop := deadlineShare(ctx, unparkShareNum, unparkShareDen)
	moved, written := 0, 0
	for {
		step, ok := s.unparking.next()
		if !ok {
			return moved, nil
		}
		if step.partition != noPartition && owned != nil && !owned[step.partition] {
			s.unparking.done()
			s.parked.stepDone(step)
			continue
		}
		n, err := s.unparkStep(ctx, step)
		if err != nil {
			s.unparking.doubt()
			return moved, err
		}
		if step.inDoubt {
			// Its failed write may have moved events back since a
			// read-ahead was read: count it as moving some.
			n = max(n, 1)
		}
		moved += n
		s.unparking.done()
		s.parked.stepDone(step)
		written++
		// At least one step a claim, however short its time: the
		// queue always moves.
		if hasStop && time.Now().After(stop) || written == s.unparkStepsMax {
			return moved, nil
		}
	}
}

// unparkStep writes one step.
func (s *Store) unparkStep(ctx context.Context, step unparkStep) (int, error) {
	var partition any = int32(step.partition)
	if step.partition == noPartition {
		partition = nil
	}
	filter := append(bson.D{
		{Key: events.FieldStatus, Value: events.StatusNew},
		{Key: events.FieldParked, Value: true},
		{Key: events.FieldPartition, Value: partition},
	}, step.filter...)
	res, err := s.coll.UpdateMany(ctx, filter, unparkUpdate)
	if err != nil {
		return 0, fmt.Errorf("unpark %s in partition %d: %w", step.what, step.partition, err)
	}
	return int(res.ModifiedCount), nil
}

// unparkUpdate takes an event out of parking.
var unparkUpdate = bson.D{{Key: "$unset", Value: bson.D{
	{Key: events.FieldParked, Value: ""},
	{Key: events.FieldParkedFor, Value: ""},
}}}

// keyFilter selects the events of a parkedKeys key.
func keyFilter(key string) bson.D {
	if typ, ok := strings.CutPrefix(key, unkeyedPrefix); ok {
		return bson.D{{Key: events.FieldType, Value: typ}, {Key: events.FieldAggregateID, Value: bson.D{{Key: "$in", Value: bson.A{nil, ""}}}}}
	}
	typ, id, _ := strings.Cut(key, "\x00")
	if typ == "" {
		// aggregateType absent or not a string: the id alone, which may
		// unpark more than the key; a claim parks again what is held.
		return bson.D{{Key: events.FieldAggregateID, Value: id}}
	}
	return bson.D{{Key: events.FieldAggregateType, Value: typ}, {Key: events.FieldAggregateID, Value: id}}
}
