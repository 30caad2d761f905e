package mongo

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
)

// Claim reads the claimable events (ReadClaimable), claims them for
// lease (ClaimRead) and parks what must wait (WriteParked): a claim with
// nothing between its read and its writes, for a single worker and for
// tests. The relay's claimer fences the write
// of its own (see the claim package).
func (s *Store) Claim(ctx context.Context, lease events.Lease, limit events.ClaimLimit) (events.ClaimResult, error) {
	docs, more, err := s.ReadClaimable(ctx, lease.At, limit)
	if err != nil {
		return events.ClaimResult{More: more}, err
	}
	res, err := s.ClaimRead(ctx, lease, docs, limit)
	res.More = more
	if _, perr := s.WriteParked(ctx, limit); perr != nil && err == nil {
		s.logger.Warn("could not park events the claim read; the next claim reads them again", "error", perr)
	}
	return res, err
}

// ReadClaimable reads what a claim at now may take: NEW events whose retry
// time has come, oldest first, up to limit's count and bytes, in the
// partitions limit owns, as the claim's plan decides (claim/plan). more
// reports that the read stopped at a bound. The lane itself is two finds
// on MongoDB (never retried, due retries) and one on FerretDB, or one per
// partition read there (see readHead), besides the reads of the holds.
//
// With limit.Ordered, the read first learns which aggregates are held
// (heldKeys: up to three projected finds; on FerretDB the events backing
// off come with the head's own find) and returns no event of those.
//
// It returns no event of a paused type (Pause), and with limit.Ordered no
// later event of an aggregate one of them holds; the paused types cost one
// more find at most once per PausedTypesMaxAge (see findClaimable).
//
// With limit.Ordered, where the events read carry their aggregate's
// version (events.FieldSequence), it returns each aggregate's in sequence
// order, takes in the earlier versions the read did not reach (up to
// limit's count and bytes again), and leaves out the later versions that
// must wait for one it cannot take (see orderBySequence): two or three
// more finds, only for such a batch.
//
// It parks nothing: what it found must wait is kept for WriteParked,
// which the claimer calls while it holds the partitions.
//
// With limit.Tenures where the deployment has transactions, it first
// raises the fence of each partition it reads in to the tenure held, once
// per tenure (one update command; see raiseFences), and leaves out the
// partitions whose fence a later tenure holds: ErrFenced the first time.
func (s *Store) ReadClaimable(ctx context.Context, now time.Time, limit events.ClaimLimit) (docs []bson.Raw, more bool, err error) {
	s.unwritten.take() // parks are this read's only
	if s.fencing(limit) {
		if limit.Owned, err = s.raiseFences(ctx, limit); err != nil {
			return nil, false, asTimeout(err)
		}
	}
	docs, more, err = s.findClaimable(ctx, now, limit)
	return docs, more, asTimeout(err)
}

// ClaimRead claims for lease the documents ReadClaimable returned, in one
// UpdateMany guarded by status NEW. The events claimed come back in no
// particular order; the claimer sorts them (events.CompareOrder).
//
// Documents a claim cannot be written to are not claimed with the rest:
// a worker-managed field of the wrong type (events.CheckManaged) or a size
// too close to the document limit (events.CheckSize) makes the event
// FAILED at once, in one guarded write per distinct lastError. A null
// attempts counts as absent and costs one more UpdateMany, since $inc
// cannot apply to null. When the server refuses the claim's UpdateMany
// because of one document, the batch is claimed one event at a time and
// each event the server refuses is made FAILED with its reason; the rest
// are claimed as usual. A network error or timeout fails the claim.
//
// When another worker won some of what was read, ClaimRead reads back
// exactly what this lease holds: one more command.
//
// With limit.Tenures where the deployment has transactions, each claim
// update runs in a transaction that first writes the fence of every
// partition it claims in under the tenure held (see fencedWrite): one
// more update and the commit. Where a later tenure holds one of them the
// transaction aborts, nothing of it is written, and the error wraps
// events.ErrFenced. The FAILED writes of refused documents stay outside
// the fence: they only touch NEW events that any owner would refuse.
func (s *Store) ClaimRead(ctx context.Context, lease events.Lease, docs []bson.Raw, limit events.ClaimLimit) (events.ClaimResult, error) {
	res, err := s.claimRead(ctx, lease, docs, limit)
	return res, asTimeout(err)
}

func (s *Store) claimRead(ctx context.Context, lease events.Lease, docs []bson.Raw, limit events.ClaimLimit) (events.ClaimResult, error) {
	// The read-ahead serves only after a write of the whole batch read.
	s.ahead.confirm(len(docs))
	var res events.ClaimResult
	if len(docs) == 0 {
		return res, nil
	}
	reserve := events.ManagedReserveBytes + len(lease.WorkerID)
	var plain, nullAttempts []events.Claimed
	var refused []refusal
	// An event refused here becomes FAILED; where that holds its key, the
	// later events of the key read with it are left NEW, to wait behind it.
	var stopped map[string]bool
	stop := func(doc bson.Raw) {
		if key, ok := events.OrderingKey(doc); ok && limit.Ordered && limit.FailedHolds {
			if stopped == nil {
				stopped = map[string]bool{}
			}
			stopped[key] = true
		}
	}
	for _, doc := range docs {
		if key, ok := events.OrderingKey(doc); ok && stopped[key] {
			continue
		}
		c := events.Claimed{Doc: doc}
		if v, err := doc.LookupErr(events.FieldID); err == nil {
			c.ID = rawID(v)
		}
		m, err := events.CheckManaged(doc)
		if err == nil {
			err = events.CheckSize(len(doc), reserve)
			if err != nil {
				refused = append(refused, refusal{id: c.ID, lastError: err.Error(), large: true, doc: doc})
				stop(doc)
				continue
			}
		}
		if err != nil {
			refused = append(refused, refusal{id: c.ID, lastError: err.Error(), doc: doc})
			stop(doc)
			continue
		}
		c.Attempts = m.Attempts + 1
		if m.AttemptsNull {
			nullAttempts = append(nullAttempts, c)
		} else {
			plain = append(plain, c)
		}
	}

	exact := true // every claimable document read was won, as read
	// refusedAt is the first event of each ordering key that this claim
	// read and did not win: the server refused it (it is FAILED, or still
	// NEW if even that write fails), or another write took it first
	// (lostAt). Either way no later event of its key goes before it.
	var refusedAt map[string]bson.Raw
	for _, group := range []struct {
		docs []events.Claimed
		null bool
	}{{plain, false}, {nullAttempts, true}} {
		if len(group.docs) == 0 {
			continue
		}
		ids := idsOf(group.docs)
		var n int
		err := s.fencedWrite(ctx, limit, group.docs, func(ctx context.Context) (err error) {
			n, err = s.claimDocs(ctx, lease, group.docs, group.null)
			return err
		})
		if errors.Is(err, events.ErrFenced) {
			return events.ClaimResult{}, fmt.Errorf("claim %d events: %w", len(ids), err)
		}
		if err == nil {
			exact = exact && n == len(ids)
			continue
		}
		if !isDocumentError(err) {
			return events.ClaimResult{}, fmt.Errorf("claim %d events: %w", len(ids), err)
		}
		// One document spoiled the update, which may have changed some
		// documents before it: claim the rest one by one, and read back
		// what this lease holds.
		exact = false
		s.logger.Warn("claim refused by the server; claiming one event at a time", "events", len(ids), "error", err)
		for _, c := range group.docs {
			key, keyed := events.OrderingKey(c.Doc)
			if keyed && refusedAt[key] != nil {
				continue // waits behind the refused event of its key
			}
			err := s.fencedWrite(ctx, limit, []events.Claimed{c}, func(ctx context.Context) error {
				_, err := s.claimIDs(ctx, lease, []any{c.ID}, group.null)
				return err
			})
			if err != nil {
				if !isDocumentError(err) {
					return events.ClaimResult{}, fmt.Errorf("claim event %v: %w", c.ID, err)
				}
				refused = append(refused, refusal{id: c.ID, lastError: "claim refused by the server: " + serverReason(err), doc: c.Doc})
				if keyed && limit.Ordered {
					if refusedAt == nil {
						refusedAt = map[string]bson.Raw{}
					}
					refusedAt[key] = c.Doc
				}
			}
		}
	}
	if exact {
		res.Claimed = slices.Concat(plain, nullAttempts)
	} else {
		// Another actor won part of what was read: what the read kept
		// past the batch may be as stale.
		s.ahead.drop()
		var err error
		if res.Claimed, err = s.findLeased(ctx, lease, len(docs)); err != nil {
			return events.ClaimResult{}, err
		}
		for key, doc := range lostAt(docs, res.Claimed, refused, limit) {
			if refusedAt == nil {
				refusedAt = map[string]bson.Raw{}
			}
			if at := refusedAt[key]; at == nil || events.CompareInKey(doc, at) < 0 {
				refusedAt[key] = doc
			}
		}
		if res.Claimed, err = s.unclaimBehind(ctx, lease, res.Claimed, refusedAt); err != nil {
			return events.ClaimResult{}, err
		}
	}
	res.Rejected = s.fail(ctx, lease, refused)
	return res, nil
}

func idsOf(cs []events.Claimed) []any {
	ids := make([]any, len(cs))
	for i, c := range cs {
		ids[i] = c.ID
	}
	return ids
}

// claimIDs claims the given NEW events for lease and returns how many it
// changed. With nullAttempts the events are those whose attempts is null,
// which $inc refuses: the claim sets 1, guarded by attempts still null.
func (s *Store) claimIDs(ctx context.Context, lease events.Lease, ids []any, nullAttempts bool) (int, error) {
	return s.claimIn(ctx, lease, ids, -1, nullAttempts)
}

// partitionWritesMax is the most partitions a claim's write on FerretDB
// names one by one (claimDocs).
const partitionWritesMax = 16

// claimDocs claims docs, as claimIDs, as the dialect writes a claim.
func (s *Store) claimDocs(ctx context.Context, lease events.Lease, docs []events.Claimed, nullAttempts bool) (int, error) {
	return s.lane.claimWrite(ctx, s, lease, docs, nullAttempts)
}

// claimByPartition claims docs, as claimIDs. On FerretDB, which matches the $in
// in Go against every document its equalities select, a batch read by
// partition that lies in a few partitions is claimed with one update per
// partition, each with an equality on it: FerretDB then decodes those
// partitions' lanes, not every NEW event. Only then: each update is a
// round trip, which a whole read's batch, spread over every partition,
// would pay up to 64 times (through a slow link, past its deadline).
func (s *Store) claimByPartition(ctx context.Context, lease events.Lease, docs []events.Claimed, nullAttempts bool) (int, error) {
	byPartition := map[int][]any{}
	for _, c := range docs {
		p, ok, err := events.StoredPartition(c.Doc)
		if !ok || err != nil {
			p = -1
		}
		byPartition[p] = append(byPartition[p], c.ID)
	}
	if !s.partitionReads.reading() || len(byPartition) > partitionWritesMax {
		return s.claimIDs(ctx, lease, idsOf(docs), nullAttempts)
	}
	n := 0
	for _, p := range slices.Sorted(maps.Keys(byPartition)) {
		won, err := s.claimIn(ctx, lease, byPartition[p], p, nullAttempts)
		n += won
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// claimIn is claimIDs within partition (none: -1).
func (s *Store) claimIn(ctx context.Context, lease events.Lease, ids []any, partition int, nullAttempts bool) (int, error) {
	filter, update := claimUpdate(lease, ids, partition, nullAttempts)
	res, err := s.coll.UpdateMany(ctx, filter, update)
	if err != nil {
		return 0, err
	}
	return int(res.ModifiedCount), nil
}

// claimUpdate is the filter and update of claimIn, apart so that a test
// can explain the very write a claim sends. The write is guarded by
// status NEW, and by parked: an event parked since the read (by a claim
// that has taken its partition since) waits with the rest of its
// aggregate; both are equalities FerretDB pushes down.
func claimUpdate(lease events.Lease, ids []any, partition int, nullAttempts bool) (filter, update bson.D) {
	filter = unparkedIn(partition, ids)
	set := bson.D{
		{Key: events.FieldStatus, Value: events.StatusProcessing},
		{Key: events.FieldWorkerID, Value: lease.WorkerID},
		{Key: events.FieldProcessingAt, Value: lease.At},
		{Key: events.FieldClaimToken, Value: lease.Token},
	}
	if nullAttempts {
		// {attempts: null} also matches a document whose attempts was
		// removed since the find; one given a number meanwhile is not
		// claimed here, and the next claim takes it.
		filter = append(filter, bson.E{Key: events.FieldAttempts, Value: nil})
		update = bson.D{{Key: "$set", Value: append(set, bson.E{Key: events.FieldAttempts, Value: 1})}}
	} else {
		update = bson.D{{Key: "$set", Value: set}, {Key: "$inc", Value: bson.D{{Key: events.FieldAttempts, Value: 1}}}}
	}
	// skipped too: left by a requeue of an earlier version, it would keep
	// the event from holding its aggregate if it fails again.
	update = append(update, bson.E{Key: "$unset", Value: bson.D{{Key: events.FieldRetryAt, Value: ""}, {Key: events.FieldSkipped, Value: ""}}})
	return filter, update
}

// asTimeout makes a timeout of any kind the driver reports (a server-side
// time limit, a network timeout, a full connection pool) match
// context.DeadlineExceeded, which is how the claimer tells that the
// database was too slow rather than broken. Other errors pass unchanged.
func asTimeout(err error) error {
	if err == nil || errors.Is(err, context.DeadlineExceeded) || !mongo.IsTimeout(err) {
		return err
	}
	return timeoutError{err}
}

type timeoutError struct{ err error }

func (e timeoutError) Error() string   { return e.err.Error() }
func (e timeoutError) Unwrap() []error { return []error{e.err, context.DeadlineExceeded} }

// serverReason is the server's own message in err, without the driver's
// wrapping.
func serverReason(err error) string {
	var we mongo.WriteException
	if errors.As(err, &we) && len(we.WriteErrors) > 0 {
		return we.WriteErrors[0].Message
	}
	var ce mongo.CommandError
	if errors.As(err, &ce) {
		return ce.Message
	}
	return err.Error()
}

// lastErrorMaxBytes bounds a lastError the store writes, so that the room
// events.ManagedReserveBytes keeps for it holds.
const lastErrorMaxBytes = 1 << 10

func truncateError(s string) string { return events.Truncate(s, lastErrorMaxBytes) }

// setOnly is an update that sets fields and nothing else.
func setOnly(fields ...bson.E) bson.D { return bson.D{{Key: "$set", Value: bson.D(fields)}} }

func claimed(doc bson.Raw) events.Claimed {
	c := events.Claimed{Doc: doc}
	if v, err := doc.LookupErr(events.FieldID); err == nil {
		c.ID = rawID(v)
	}
	m, _ := events.CheckManaged(doc)
	c.Attempts = m.Attempts
	return c
}

// rawID turns a stored _id into a value a filter can match it with.
func rawID(v bson.RawValue) any {
	switch v.Type {
	case bson.TypeObjectID:
		return v.ObjectID()
	case bson.TypeString:
		return v.StringValue()
	default:
		return v // any other _id type still matches itself
	}
}
