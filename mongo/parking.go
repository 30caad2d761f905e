package mongo

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
)

// A claim's plan parks the events that must wait (claim/plan). The read
// stamps what it found without a partition at once, but the parks wait
// for the claimer's hold on the partitions (WriteParked): a park written
// after the partition was given away could land after its new owner read
// which aggregates have parked events, and the new owner would then take
// a later event of such an aggregate before the parked one.

// parking is what one claim's read found to park or to stamp.
type parking struct {
	// park lists the events to park, by reason (events.ParkedPaused,
	// events.ParkedHeld), then by the partition they were read in, -1
	// where the read was not by partition; parked counts them by reason.
	park   map[string]map[int][]parkID
	parked map[string]int
	// stamp lists the events read without a stored partition, by the
	// partition they hash to (MongoDB only: the write is a pipeline
	// update, which FerretDB does not have).
	stamp   map[int][]any
	stamped int
	// cap bounds what a whole read parks for each reason (0: none; the
	// dialect's parkCap).
	cap int
}

// parkID is an event to park, and its partition.
type parkID struct {
	id        any
	partition int
	key       string // its parked key (plan.ParkedKey)
}

// parkMax bounds the events one claim parks for each reason on FerretDB,
// and stamps, where it did not read by partition: an $in of more ids costs FerretDB,
// which matches it in Go against every NEW event, more than the reads it
// spares. The rest are read and left out by the next claims, which park
// them in turn. A read by partition (FerretDB, partitionreads.go) parks
// what it met in each partition, with an equality on the partition that
// leaves FerretDB that partition's lane to match: each event it parks is
// one it read, once.
const parkMax = 1000

// addPark notes the event id of partition, read in at (-1: a whole
// read), to park for reason.
func (p *parking) addPark(reason string, at, partition int, key string, id any) {
	if p.park == nil {
		p.park, p.parked = map[string]map[int][]parkID{}, map[string]int{}
	}
	if at < 0 && p.cap > 0 && p.parked[reason] >= p.cap {
		return
	}
	if p.park[reason] == nil {
		p.park[reason] = map[int][]parkID{}
	}
	p.park[reason][at] = append(p.park[reason][at], parkID{id: id, partition: partition, key: key})
	if at < 0 {
		p.parked[reason]++
	}
}

func (p *parking) addStamp(partition int, id any) {
	if p.stamp == nil {
		p.stamp = map[int][]any{}
	}
	if p.stamped < parkMax {
		p.stamp[partition] = append(p.stamp[partition], id)
		p.stamped++
	}
}

// writeStamps stores the partitions of the events read without one. A
// stamp is no hold: any replica's claim may write it.
func (p *parking) writeStamps(ctx context.Context, s *Store) error {
	if len(p.stamp) == 0 {
		return nil
	}
	return s.stampPartitions(ctx, p.stamp)
}

// in keeps of what is to park the events of the partitions owned marks
// (every one when nil), and returns those partitions.
func (p *parking) in(owned []bool) []int {
	var seen [events.Partitions]bool
	for _, byAt := range p.park {
		for at, ids := range byAt {
			ids = slices.DeleteFunc(ids, func(x parkID) bool { return owned != nil && !owned[x.partition] })
			for _, x := range ids {
				seen[x.partition] = true
			}
			byAt[at] = ids
		}
	}
	var ps []int
	for q, ok := range seen {
		if ok {
			ps = append(ps, q)
		}
	}
	return ps
}

// writeParks parks, by reason and then partition read in, until two
// thirds of ctx's time are gone: the rest is read again by the next
// claims, which park it in turn. Every write is guarded by status NEW
// and not parked; none is needed for correctness, since each claim plans
// again with what it reads.
func (p *parking) writeParks(ctx context.Context, s *Store) error {
	stop, hasStop := deadlineShare(ctx, 2, 3)
	var errs []error
	for _, reason := range slices.Sorted(maps.Keys(p.park)) {
		for _, at := range slices.Sorted(maps.Keys(p.park[reason])) {
			if hasStop && time.Now().After(stop) {
				return errors.Join(errs...)
			}
			ids := p.park[reason][at]
			if len(ids) == 0 {
				continue
			}
			vals := make([]any, len(ids))
			for i, x := range ids {
				vals[i] = x.id
			}
			if err := s.park(ctx, reason, at, vals); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// unwrittenParks is the parks of the last read, until the claimer writes
// them under its hold (WriteParked) or the next read replaces them.
type unwrittenParks struct {
	mu sync.Mutex
	p  parking
}

func (u *unwrittenParks) put(p parking) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.p = parking{park: p.park, parked: p.parked, cap: p.cap}
}

func (u *unwrittenParks) take() parking {
	u.mu.Lock()
	defer u.mu.Unlock()
	p := u.p
	u.p = parking{}
	return p
}

// WriteParked parks what the last read (ReadClaimable) found must wait,
// in the partitions limit.Owned marks (every one when nil), and forgets
// the rest: the claimer calls it while it holds those partitions, after
// its claim's write, so that no park lands after a give-back. Where the
// deployment has transactions and limit carries tenures, the parks are
// one transaction fenced like a claim (fencedWrite). It returns the
// partitions it wrote in, for an error the caller treats as in doubt.
func (s *Store) WriteParked(ctx context.Context, limit events.ClaimLimit) ([]int, error) {
	p := s.unwritten.take()
	ps := p.in(limit.Owned)
	if len(ps) == 0 {
		return nil, nil
	}
	err := s.fencedIn(ctx, limit, ps, func(ctx context.Context) error { return p.writeParks(ctx, s) })
	if err != nil {
		// A park in doubt may still land until its deadline: its keys are
		// not unparked before, or an unpark written first would leave
		// the park's events parked with nothing to unpark them.
		until, ok := ctx.Deadline()
		if !ok {
			until = time.Now()
		}
		s.parked.inDoubt(p.keys(), until.Add(parkDoubtMargin))
		return ps, asTimeout(err)
	}
	return ps, nil
}

// parkDoubtMargin is how long past its deadline a park in doubt is
// taken to be able to land: the server's tail of a write, as a give-back
// allows for.
const parkDoubtMargin = time.Second

// keys are the parked keys of what is to park.
func (p *parking) keys() []string {
	var keys []string
	for _, byAt := range p.park {
		for _, ids := range byAt {
			for _, x := range ids {
				keys = append(keys, x.key)
			}
		}
	}
	return keys
}

// Forget drops what the last read found to park: the claimer could not
// write it while it held the partitions, and the next claims read it
// again.
func (s *Store) Forget() { s.unwritten.take() }

// unparkedIn selects the NEW events ids that are not parked, within
// partition (none: -1): every equality FerretDB pushes down first.
func unparkedIn(partition int, ids []any) bson.D {
	filter := bson.D{
		{Key: events.FieldStatus, Value: events.StatusNew},
		{Key: events.FieldParked, Value: bson.D{{Key: "$ne", Value: true}}},
	}
	if partition >= 0 {
		filter = append(filter, bson.E{Key: events.FieldPartition, Value: int32(partition)})
	}
	return append(filter, bson.E{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: ids}}})
}

// park parks the NEW events ids for reason. Events read by partition are
// parked by partition: FerretDB pushes the equality down, and matches the
// $in in Go against that partition's lane only, not against every NEW
// event.
func (s *Store) park(ctx context.Context, reason string, partition int, ids []any) error {
	filter := unparkedIn(partition, ids)
	update := setOnly(
		bson.E{Key: events.FieldParked, Value: true},
		bson.E{Key: events.FieldParkedFor, Value: reason},
	)
	if _, err := s.coll.UpdateMany(ctx, filter, update); err != nil {
		return fmt.Errorf("park %d events (%s): %w", len(ids), reason, err)
	}
	return nil
}

// stampPartitions stores the partition of events written without one, in
// one update: a pipeline whose $switch gives each _id its partition.
func (s *Store) stampPartitions(ctx context.Context, byPartition map[int][]any) error {
	var ids, branches bson.A
	for _, p := range slices.Sorted(maps.Keys(byPartition)) {
		ids = append(ids, byPartition[p]...)
		branches = append(branches, bson.D{
			{Key: "case", Value: bson.D{{Key: "$in", Value: bson.A{"$" + events.FieldID, bson.A(byPartition[p])}}}},
			{Key: "then", Value: int32(p)},
		})
	}
	filter := bson.D{
		{Key: events.FieldStatus, Value: events.StatusNew},
		{Key: events.FieldPartition, Value: nil},
		{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: ids}}},
	}
	pipeline := bson.A{bson.D{{Key: "$set", Value: bson.D{{Key: events.FieldPartition, Value: bson.D{
		{Key: "$switch", Value: bson.D{{Key: "branches", Value: branches}, {Key: "default", Value: nil}}},
	}}}}}}
	if _, err := s.coll.UpdateMany(ctx, filter, pipeline); err != nil {
		return fmt.Errorf("store the partition of %d events: %w", len(ids), err)
	}
	return nil
}
