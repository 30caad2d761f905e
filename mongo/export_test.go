package mongo

import (
	"context"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/fakeclock"
)

// SetSplitClaim chooses the claim's find strategy, so that the two-find
// claim MongoDB uses is tested on FerretDB too.
func SetSplitClaim(s *Store, split bool) { s.lane = dialectFor(!split) }

// SetOnePassStats chooses how Stats counts, so that the counts by index
// MongoDB uses are tested on FerretDB too.
func SetOnePassStats(s *Store, onePass bool) { s.onePassStats = onePass }

// SetLocalClock replaces the local clock a Clock measures against, so that
// a test can skew it. local must behave as time.Now does: its intervals
// (Sub) are those of the monotonic clock, as time.Now().Add(skew)'s are.
func SetLocalClock(c *Clock, local func() time.Time) { c.wall, c.mono = local, local }

// SetFakeClock makes a Clock read fake's wall clock as its local wall
// clock and fake's monotonic clock to measure intervals, so that a test
// can step the wall clock apart from the time that passes.
func SetFakeClock(c *Clock, fake *fakeclock.Clock) { c.wall, c.mono = fake.Now, fake.Mono }

// SetPublishChartMax sets the largest outbox whose publish chart FerretDB
// draws, so that a test passes it with a few events.
func SetPublishChartMax(s *Store, n int64) { s.chartMax = n }

// IsFerretDB reports what Detect learnt: the server is FerretDB.
func IsFerretDB(s *Store) bool { return s.ferret }

// SetHeldWindow bounds Held's reads to n documents, so that a test reaches
// the bound with a few events.
func SetHeldWindow(s *Store, n int) { s.heldWindow = n }

// RaiseFences raises the fences of the partitions a read under limit
// claims in, as ReadClaimable does where the deployment has transactions,
// so that the fence's filter and update run on FerretDB, which has none.
func RaiseFences(ctx context.Context, s *Store, limit events.ClaimLimit) ([]bool, error) {
	return s.raiseFences(ctx, limit)
}

// EnsureFences creates the fence documents, as Prepare does where the
// deployment has transactions.
func EnsureFences(ctx context.Context, s *Store) error {
	_, err := s.ensureFences(ctx)
	return err
}

// SetPausedMaxAge sets how long the store's claims use the paused types
// they read (PausedTypesMaxAge), so that a test makes every claim read
// them (0) or none after the first (a long time).
func SetPausedMaxAge(s *Store, d time.Duration) { s.pausedCache.maxAge = d }

// SetUnparkStepsMax bounds the unpark steps a claim writes, so that a
// test sees an unpark spread over claims whatever the time they take.
func SetUnparkStepsMax(s *Store, n int) { s.unparkStepsMax = n }

// QueuedUnparkSteps is how many unpark steps wait for the next claims.
func QueuedUnparkSteps(s *Store) int { return s.unparking.len() }

// ForgetParked makes the next claim read the parked events again, as it
// does every parkedReload and after a restart.
func ForgetParked(s *Store) {
	s.parked.mu.Lock()
	defer s.parked.mu.Unlock()
	s.parked.loaded = nil
}

// ExplainLane explains, with executionStats, the finds a claim of limit
// at now would read its lane with: its first page, on the lane index.
func ExplainLane(ctx context.Context, s *Store, now time.Time, limit events.ClaimLimit) ([]bson.Raw, error) {
	r := headReader{s: s, now: now, limit: limit}
	var out []bson.Raw
	for _, f := range r.filters() {
		cmd := bson.D{
			{Key: "explain", Value: bson.D{
				{Key: "find", Value: s.coll.Name()},
				{Key: "filter", Value: f},
				{Key: "sort", Value: bson.D{{Key: events.FieldCreatedAt, Value: 1}, {Key: events.FieldID, Value: 1}}},
				{Key: "limit", Value: limit.Events},
				{Key: "hint", Value: laneIndex},
			}},
			{Key: "verbosity", Value: "executionStats"},
		}
		res, err := s.coll.Database().RunCommand(ctx, cmd).Raw()
		if err != nil {
			return nil, err
		}
		out = append(out, res)
	}
	return out, nil
}

// ExplainClaimWrite explains, without running it, the update a claim of
// ids writes on MongoDB (indexedLane.claimWrite): on a sharded cluster,
// which shards mongos sends it to.
func ExplainClaimWrite(ctx context.Context, s *Store, lease events.Lease, ids []any) (bson.Raw, error) {
	filter, update := claimUpdate(lease, ids, -1, false)
	cmd := bson.D{
		{Key: "explain", Value: bson.D{
			{Key: "update", Value: s.coll.Name()},
			{Key: "updates", Value: bson.A{bson.D{{Key: "q", Value: filter}, {Key: "u", Value: update}, {Key: "multi", Value: true}}}},
		}},
		{Key: "verbosity", Value: "queryPlanner"},
	}
	return s.coll.Database().RunCommand(ctx, cmd).Raw()
}

// LaneIndex is the index the claim's lane finds name.
const LaneIndex = laneIndex

// DropReadAhead forgets what the last claim read past its batch.
func DropReadAhead(s *Store) { s.ahead.drop() }

// ReadFences reads the fences of ps, as a refused claim does.
func ReadFences(ctx context.Context, s *Store, ps []int) (map[int]int64, error) {
	return s.readFences(ctx, ps)
}

// ReadByPartition makes the store's next claim on FerretDB read its lane
// by partition, as after a whole read that timed out.
func ReadByPartition(s *Store) {
	s.partitionReads.mu.Lock()
	defer s.partitionReads.mu.Unlock()
	s.partitionReads.byPartition = true
}

// ReadsByPartition reports whether the store's next claim on FerretDB
// reads its lane by partition (partitionreads.go).
func ReadsByPartition(s *Store) bool {
	s.partitionReads.mu.Lock()
	defer s.partitionReads.mu.Unlock()
	_, scanned := s.lane.(scannedLane)
	return scanned && s.partitionReads.byPartition
}

// SetSequenceAnomaly sets Config.SequenceAnomaly on a store made without.
func SetSequenceAnomaly(s *Store, f func(kind string, n int)) { s.sequenceAnomaly = f }

// SplitClaim reports whether s reads the lane by index (MongoDB's way).
func SplitClaim(s *Store) bool {
	_, indexed := s.lane.(indexedLane)
	return indexed
}

// SetMaxHeadRead bounds the events one claim's read goes through, so that
// a test reaches the bound with a small lane.
func SetMaxHeadRead(s *Store, n int) { s.headReadMax = n }

// ResyncClock runs one run of a Clock's schedule: a measurement if one is
// due.
func ResyncClock(ctx context.Context, c *Clock) { _, _ = c.resync(ctx) }
