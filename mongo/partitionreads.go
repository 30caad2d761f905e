package mongo

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/claim/plan"
	"github.com/outboxrelay/outbox/events"
)

// On FerretDB a find costs a decode of every document its equalities
// match, whatever its sort and limit: one read of a lane of 50,000 NEW
// events decodes all of them (about 6 s on this stack), and several
// replicas doing it at once outlast the claim's read timeout, claim after
// claim. The partition is stored on the event, and an equality on it is
// pushed down to PostgreSQL, so a claim there reads a large lane one
// owned partition at a time, each sorted on its own, until its batch is
// full: it decodes about batch + what the partitions read hold ahead of
// it, not the lane. Order is per aggregate, and an aggregate lives in one
// partition, so partitions may be read in any order; the next claim starts
// where this one stopped, so that every partition gets its turn.
//
// A lane is read in one find, as before, until such a read times out, or
// fills its window in a lane several replicas share whose partitions are
// deep enough to fill a batch in a find or two (it decoded theirs too):
// sixty-four finds (one replica owns every partition) cost more round
// trips than one, and a whole read keeps the claim oldest first across
// partitions. A read by partition that went through every owned
// partition and found fewer documents than one whole read returns reads
// the whole lane next.
//
// Reading by partition leaves out the NEW events whose partition is not a
// lane's: written without one, by a producer that does not use
// events.Insert (FerretDB's claims cannot store it: no pipeline updates),
// or misfiled. A probe looks for them at most once a parkedReload (one
// unsorted find, which stops at the first it decodes); while it finds
// some, claims read the whole lane, which claims them, or fails them.
// The probe costs a decode of the NEW events when it finds none, so it is
// not run on every claim: an event written without a partition while
// claims read by partition waits for the next probe, and a later event of
// its aggregate written with one may be claimed before it meanwhile. That
// is FerretDB's alone (MongoDB's lane reads such events through null) and
// only with producers that do not use events.Insert (docs/design.md).

// probeMax bounds the time a probe takes from a claim.
const probeMax = 10 * time.Second

// partitionReads is what a store's claims on FerretDB know of their lane:
// whether to read it by partition, where the next such read starts, and
// what the last probe for events outside every partition found.
type partitionReads struct {
	mu          sync.Mutex
	byPartition bool
	next        int // the partition the next read by partition starts at
	// outside says the last probe found NEW events outside every lane;
	// probeDue is when the next probe runs (zero: now).
	outside  bool
	probeDue time.Time
	// shared says the claims read by partition because whole reads
	// filled their window in a shared lane, not because one timed out
	// (readWhole): then a read by partition that needs many partitions
	// to fill its batch reads whole again (readPartitions).
	shared bool
	// sharedAfter is when a full whole read of a shared lane may start
	// reads by partition again, after one that needed too many
	// partitions went back to whole reads: without it the claims took
	// turns, a whole read's read-ahead thrown away by the read by
	// partition that followed it.
	sharedAfter time.Time
}

// sharedRetry is how long after a read by partition of a shared lane
// went back to whole reads the claims stay with them.
const sharedRetry = time.Minute

// sharedVisitsMax is the most partitions a read by partition, begun for
// a shared lane, may go through to fill its batch before the claims read
// the lane whole again. Each partition is a find, and on FerretDB a scan
// of the table: at 10,000 events three replicas' partitions hold a fifth
// of a batch each, and reading them so tripled the commands per event
// for no gain, where at 50,000 with four replicas a partition fills a
// batch.
const sharedVisitsMax = 2

// usePartitionReads reports whether a claim at now reads by partition,
// probing first when a probe is due. A probe that fails is not retried
// before the next is due: it failed for want of time, which a retry
// would take from the claims again. Meanwhile what the last probe found
// stands (at first, that there are none: a claim that cannot read the
// lane whole must still go on).
func (s *Store) usePartitionReads(ctx context.Context, now time.Time) bool {
	pr := &s.partitionReads
	pr.mu.Lock()
	want, due := pr.byPartition, !now.Before(pr.probeDue)
	pr.mu.Unlock()
	if !want {
		return false
	}
	if due {
		outside, err := s.probeOutside(ctx)
		pr.mu.Lock()
		pr.probeDue = now.Add(parkedReload)
		if err == nil {
			pr.outside = outside
		}
		pr.mu.Unlock()
		if err != nil {
			s.logger.Debug("could not look for events outside every partition; the claims read by partition", "error", err)
		}
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return !pr.outside
}

// probeOutside reports whether a NEW event that is not parked has no
// lane's partition (parked events are in no lane; unparked, the next
// probe sees them). It has a quarter of the time the claim has left, and
// at most probeMax: it decodes every unparked NEW event when it finds
// none, and on a busy host the claim's own read comes first.
func (s *Store) probeOutside(ctx context.Context) (bool, error) {
	budget := probeMax
	if deadline, ok := ctx.Deadline(); ok {
		budget = min(budget, time.Until(deadline)/4)
	}
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	filter := bson.D{
		{Key: events.FieldStatus, Value: events.StatusNew},
		{Key: events.FieldParked, Value: bson.D{{Key: "$ne", Value: true}}},
		{Key: events.FieldPartition, Value: bson.D{{Key: "$nin", Value: lanePartitions(nil)[1:]}}},
	}
	opts := options.Find().SetLimit(1).SetProjection(bson.D{{Key: events.FieldID, Value: 1}})
	cur, err := s.coll.Find(ctx, filter, opts)
	if err != nil {
		return false, fmt.Errorf("find events outside every partition: %w", err)
	}
	defer closeCursor(ctx, cur)
	found := cur.Next(ctx)
	if err := cur.Err(); err != nil {
		return false, fmt.Errorf("read events outside every partition: %w", err)
	}
	return found, nil
}

// readWhole notes what a read of the whole lane met. One that timed out
// is read by partition next, since the next whole read would cost as
// much; so is one that filled its window in a lane other replicas share
// (shared), which decoded all their events to find its own: with four
// replicas draining 50,000 events each whole read decoded all of them,
// and they drained at a third of one replica's rate. Otherwise a whole
// read goes on: it keeps the claim oldest first across partitions and
// costs one round trip, which a slow link makes worth more than the
// decoding a read by partition spares. outside says the read met an
// event outside every lane; one that met none says nothing of the events
// its filter left out (backing off, skipped), so only a probe clears it.
func (pr *partitionReads) readWhole(outside bool, err error, shared bool, now time.Time) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	pr.outside = pr.outside || outside
	switch {
	case err != nil && isTimeout(err):
		pr.byPartition, pr.shared = true, false
	case err == nil && shared && !now.Before(pr.sharedAfter):
		pr.byPartition, pr.shared = true, true
	}
}

// reading reports whether the claims read by partition now.
func (pr *partitionReads) reading() bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.byPartition && !pr.outside
}

// probeNow makes the next claim that would read by partition probe
// first: events unparked may be outside every lane.
func (pr *partitionReads) probeNow() {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	pr.probeDue = time.Time{}
}

// readPartition notes that a read by partition went through partition
// p: the next starts after it.
func (pr *partitionReads) readPartition(p int) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	pr.next = (p + 1) % events.Partitions
}

// readPartitions notes what a read by partition met: read documents in
// all, having gone through every owned partition (all) or not, against
// whole, what one read of the whole lane returns, and visited partitions
// to fill its batch (full) or not. A lane that a whole read would return
// is read whole again; so is a shared lane whose partitions are too
// shallow to fill a batch in sharedVisitsMax, for sharedRetry.
func (pr *partitionReads) readPartitions(all bool, read, whole, visited int, full bool, now time.Time) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.shared && full && visited > sharedVisitsMax {
		pr.sharedAfter = now.Add(sharedRetry)
		pr.byPartition, pr.shared = false, false
	}
	if all && read < whole {
		pr.byPartition, pr.shared = false, false
	}
}

// start is the partition a read by partition starts at.
func (pr *partitionReads) start() int {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.next
}

// deadlineShare is num/den of the way from now to ctx's deadline.
func deadlineShare(ctx context.Context, num, den int) (time.Time, bool) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return time.Time{}, false
	}
	now := time.Now()
	return now.Add(deadline.Sub(now) * time.Duration(num) / time.Duration(den)), true
}

// isTimeout reports whether err is a timeout of the client or the server.
func isTimeout(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || mongo.IsTimeout(err)
}

// readByPartition reads the owned partitions' lanes one after the other,
// from the one after where the last read stopped, until the batch is
// full (and its read-ahead, from the partition that filled it), or every
// owned partition has been read.
func (r *headReader) readByPartition(ctx context.Context) error {
	owned := ownedList(r.limit.Owned)
	if owned == nil {
		for p := range events.Partitions {
			owned = append(owned, p)
		}
	}
	first := r.s.partitionReads.start()
	at := 0
	for at < len(owned) && owned[at] < first {
		at++
	}
	r.byPartition = true
	r.plan = plan.New(r.s.snapshot(r.now, r.limit, r.q, r.aheadMax))
	r.plan.ReadingPartition(true)
	visited := 0
	soft, hasSoft := deadlineShare(ctx, 1, 3)
	for visited < len(owned) && !r.plan.Full() && !r.h.more {
		if visited > 0 && hasSoft && time.Now().After(soft) {
			// A third of the read's time is gone: it claims what it
			// found, and the next claim goes on from here (more).
			r.h.more = true
			break
		}
		last := owned[(at+visited)%len(owned)]
		visited++
		r.partition, r.after, r.pages, r.h.ended = last, nil, 0, false
		for {
			next, err := r.page(ctx)
			if err != nil {
				return err
			}
			if !next {
				break
			}
		}
		r.s.partitionReads.readPartition(last)
	}
	r.finish()
	// The lane ended only if the last partition read did and every other
	// was read through before it.
	r.h.ended = r.h.ended && visited == len(owned)
	out := r.outcome()
	r.s.partitionReads.readPartitions(visited == len(owned), out.Read+len(out.Ahead), r.window(), visited, r.plan.Full(), r.now)
	return nil
}
