package mongo

import (
	"context"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/claim/plan"
	"github.com/outboxrelay/outbox/events"
)

// laneDialect is how a store's claims read and write their lane on one
// kind of server; Detect chooses one, once. MongoDB plans each find on the
// lane index and matches an $in through an index: the claim names the
// owned partitions, reads its lane in index order and stores the
// partition of events written without one (indexedLane). FerretDB pushes
// only equalities and $ne down to PostgreSQL, decodes what they select and
// sorts in Go: the claim reads by status and not parked, skips other
// replicas' events as it goes, reads by partition when the lane is large,
// and bounds every $in (scannedLane). The plan (claim/plan) is the same on
// both.
type laneDialect interface {
	// shape tells the plan how the lane was read.
	shape(snap *plan.Snapshot)
	// backoffInLane says the lane's reads return the events backing off
	// too (their keys are then held as the plan meets them); otherwise
	// the holds' reads find them.
	backoffInLane() bool
	// read reads the lane for r, page after page, and plans over it.
	read(ctx context.Context, r *headReader) error
	// window is how many times its own window a whole read returns.
	window(owned []bool) int
	// laneClauses are what a lane find adds to status NEW: parked, and
	// the partitions read; retryClauses the finds' retryAt clauses, one
	// find each (none: one find without).
	laneClauses(r *headReader) bson.D
	retryClauses(now time.Time, withBackoff bool) []bson.D
	// nextPageLimit is the limit of the page after the first: 0 for none.
	nextPageLimit(limit int) int
	// hint is the index a lane find names, "" for none.
	hint() string
	// parkCap bounds what one whole read parks for each reason (0: none).
	parkCap() int
	// inPartitions is a clause selecting the events of partitions ps (and
	// those without a stored partition); ok is false where the server
	// would match it in Go against everything it decodes anyway.
	inPartitions(ps []int) (clause bson.E, ok bool)
	// boundsEach says the server plans each clause of an $or on an
	// index, so that a sequence check bounds each aggregate by its own
	// versions (sequenceFilter).
	boundsEach() bool
	// misfiled reads the NEW events no lane reads, on a full reload.
	misfiled(ctx context.Context, s *Store) ([]bson.Raw, error)
	// claimWrite claims docs for lease: one update, or one per partition.
	claimWrite(ctx context.Context, s *Store, lease events.Lease, docs []events.Claimed, nullAttempts bool) (int, error)
}

// dialectFor is the dialect of a FerretDB server (ferret) or MongoDB.
func dialectFor(ferret bool) laneDialect {
	if ferret {
		return scannedLane{}
	}
	return indexedLane{}
}

// indexedLane is MongoDB's lane: index ranges that name what they read.
type indexedLane struct{}

func (indexedLane) shape(snap *plan.Snapshot) { snap.LaneOwned, snap.Stamp = true, true }
func (indexedLane) backoffInLane() bool       { return false }
func (indexedLane) read(ctx context.Context, r *headReader) error {
	return r.readPages(ctx)
}
func (indexedLane) window([]bool) int { return 1 }

func (indexedLane) laneClauses(r *headReader) bson.D {
	return bson.D{
		{Key: events.FieldParked, Value: nil},
		{Key: events.FieldPartition, Value: bson.D{{Key: "$in", Value: lanePartitions(r.limit.Owned)}}},
	}
}

// retryClauses are two finds on the lane index: events never retried
// ({retryAt: null}, in index order, so the server examines what it
// returns), and due retries (usually few; the server sorts them).
func (indexedLane) retryClauses(now time.Time, _ bool) []bson.D {
	return []bson.D{
		{{Key: events.FieldRetryAt, Value: nil}},
		{{Key: events.FieldRetryAt, Value: bson.D{{Key: "$ne", Value: nil}, {Key: "$not", Value: bson.D{{Key: "$gt", Value: now}}}}}},
	}
}

func (indexedLane) nextPageLimit(limit int) int { return limit }
func (indexedLane) hint() string                { return laneIndex }
func (indexedLane) parkCap() int                { return 0 }

func (indexedLane) inPartitions(ps []int) (bson.E, bool) {
	in := bson.A{nil}
	for _, p := range ps {
		in = append(in, int32(p))
	}
	return bson.E{Key: events.FieldPartition, Value: bson.D{{Key: "$in", Value: in}}}, true
}

func (indexedLane) boundsEach() bool { return true }

func (indexedLane) misfiled(ctx context.Context, s *Store) ([]bson.Raw, error) {
	return s.misfiled(ctx)
}

func (indexedLane) claimWrite(ctx context.Context, s *Store, lease events.Lease, docs []events.Claimed, nullAttempts bool) (int, error) {
	return s.claimIDs(ctx, lease, idsOf(docs), nullAttempts)
}

// scannedLane is FerretDB's lane: equalities pushed down, the rest in Go.
type scannedLane struct{}

func (scannedLane) shape(*plan.Snapshot) {}
func (scannedLane) backoffInLane() bool  { return true }

// read reads the lane by partition where whole reads timed out or read
// other replicas' events to fill their window (partitionreads.go),
// otherwise whole, noting what the whole read found for that choice.
func (scannedLane) read(ctx context.Context, r *headReader) error {
	if r.s.usePartitionReads(ctx, r.now) {
		return r.readByPartition(ctx)
	}
	err := r.readPages(ctx)
	r.s.partitionReads.readWhole(r.outcome().Outside, err, r.sharedAndFull(), r.now)
	return err
}

func (scannedLane) window(owned []bool) int { return shareOf(owned) }

// laneClauses: FerretDB pushes $ne down to PostgreSQL, so parked events
// are never decoded; it would not push null down. A read by partition
// names its partition, an equality it pushes down too.
func (scannedLane) laneClauses(r *headReader) bson.D {
	c := bson.D{{Key: events.FieldParked, Value: bson.D{{Key: "$ne", Value: true}}}}
	if r.byPartition {
		c = append(c, bson.E{Key: events.FieldPartition, Value: int32(r.partition)})
	}
	return c
}

// retryClauses: one find, which sorts the lane in Go whatever it selects;
// with the events backing off too where the plan holds their keys.
func (scannedLane) retryClauses(now time.Time, withBackoff bool) []bson.D {
	if withBackoff {
		return []bson.D{nil}
	}
	return []bson.D{{{Key: events.FieldRetryAt, Value: bson.D{{Key: "$not", Value: bson.D{{Key: "$gt", Value: now}}}}}}}
}

// nextPageLimit: each page sorts the whole lane again, so the second has
// no limit and is read as far as needed: a head the claim reads past
// costs two sorts, not one per page.
func (scannedLane) nextPageLimit(int) int { return 0 }
func (scannedLane) hint() string          { return "" }
func (scannedLane) parkCap() int          { return parkMax }

func (scannedLane) inPartitions([]int) (bson.E, bool) { return bson.E{}, false }

// boundsEach: FerretDB matches an $or in Go, after decoding every event.
func (scannedLane) boundsEach() bool { return false }

// misfiled: the claims read by status and parked: {$ne: true}, and meet
// such events at the head.
func (scannedLane) misfiled(context.Context, *Store) ([]bson.Raw, error) { return nil, nil }

func (scannedLane) claimWrite(ctx context.Context, s *Store, lease events.Lease, docs []events.Claimed, nullAttempts bool) (int, error) {
	return s.claimByPartition(ctx, lease, docs, nullAttempts)
}
