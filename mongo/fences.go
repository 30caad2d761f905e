package mongo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
)

// FencesSuffix names the fence collection after the outbox collection:
// "<collection>_fences". It holds one document per partition, and only
// where the deployment has transactions.
const FencesSuffix = "_fences"

// fencePrefix starts a fence document's _id: "fence/<partition>".
const fencePrefix = "fence/"

// The fields of a fence document: the latest tenure a claim or a reader
// wrote under, and a count of those writes.
const (
	fieldTenure = "tenure"
	fieldWrites = "writes"
)

// fences is what this store knows of the fence documents: the tenure it
// raised each partition's fence to, and the tenure the fence refused it.
// A tenure only grows, so both only save commands: the claim's own write
// checks the fence on the server every time.
type fences struct {
	mu      sync.Mutex
	raised  [events.Partitions]int64
	refused [events.Partitions]int64
}

func fenceID(p int) string { return fencePrefix + strconv.Itoa(p) }

// Fences returns the fence collection next to the outbox collection. Its
// writes outside a transaction carry the transactions' write concern
// (majority by default): a raise acknowledged so is in every majority
// read after it, and so are the claims committed before it.
func (s *Store) Fences() *mongo.Collection {
	return s.coll.Database().Collection(s.coll.Name()+FencesSuffix, options.Collection().SetWriteConcern(s.writeConcern))
}

// fencing reports whether a claim under limit goes through the fence:
// the deployment has transactions and the claim says its tenures.
func (s *Store) fencing(limit events.ClaimLimit) bool { return s.txn && limit.Tenures != nil }

// fenceModel is the write of partition p's fence under tenure: it matches
// while no later tenure has written, raises the fence to tenure, and
// always changes the document (writes), so that inside a transaction it
// takes the document's write: a concurrent write of the fence under
// another tenure then conflicts with it, and one of the two waits for, or
// is retried after, the other. A write that changed nothing would not
// conflict, and a stale claim could commit after a newer owner's read.
func fenceModel(p int, tenure int64) *mongo.UpdateOneModel {
	return mongo.NewUpdateOneModel().
		SetFilter(bson.D{
			{Key: "_id", Value: fenceID(p)},
			{Key: fieldTenure, Value: bson.D{{Key: "$lte", Value: tenure}}},
		}).
		SetUpdate(bson.D{
			{Key: "$set", Value: bson.D{{Key: fieldTenure, Value: tenure}}},
			{Key: "$inc", Value: bson.D{{Key: fieldWrites, Value: int64(1)}}},
		})
}

// writeFences writes the fence of each partition of ps under its tenure
// in one update command, and reports whether every one matched.
func (s *Store) writeFences(ctx context.Context, ps []int, tenures []int64, ordered bool) (bool, error) {
	models := make([]mongo.WriteModel, len(ps))
	for i, p := range ps {
		models[i] = fenceModel(p, tenures[p])
	}
	res, err := s.Fences().BulkWrite(ctx, models, options.BulkWrite().SetOrdered(ordered))
	if err != nil {
		return false, fmt.Errorf("write the fence of %d partitions: %w", len(ps), err)
	}
	return int(res.MatchedCount) == len(ps), nil
}

// ensureFences creates the fence documents that do not exist yet, at
// tenure 0, in one unordered insert: a document another replica created
// meanwhile is a duplicate key, not an error. The collection then exists
// before any transaction writes to it (MongoDB before 4.4 cannot create
// one inside a transaction). It returns how many it created.
func (s *Store) ensureFences(ctx context.Context) (int, error) {
	docs := make([]any, events.Partitions)
	for p := range docs {
		docs[p] = bson.D{{Key: "_id", Value: fenceID(p)}, {Key: fieldTenure, Value: int64(0)}, {Key: fieldWrites, Value: int64(0)},
			{Key: FieldSchema, Value: SchemaVersion}}
	}
	_, err := s.Fences().InsertMany(ctx, docs, options.InsertMany().SetOrdered(false))
	if err == nil {
		return len(docs), nil
	}
	var bwe mongo.BulkWriteException
	if errors.As(err, &bwe) && bwe.WriteConcernError == nil && len(bwe.WriteErrors) > 0 &&
		!slices.ContainsFunc(bwe.WriteErrors, func(we mongo.BulkWriteError) bool { return !mongo.IsDuplicateKeyError(we) }) {
		return len(docs) - len(bwe.WriteErrors), nil
	}
	return 0, fmt.Errorf("create the fence documents: %w", err)
}

// readFences returns the tenure of the fence of each partition of ps
// that has a fence document.
func (s *Store) readFences(ctx context.Context, ps []int) (map[int]int64, error) {
	ids := make([]string, len(ps))
	for i, p := range ps {
		ids[i] = fenceID(p)
	}
	cur, err := s.Fences().Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}})
	if err != nil {
		return nil, fmt.Errorf("read the fences: %w", err)
	}
	defer closeCursor(ctx, cur)
	out := make(map[int]int64, len(ps))
	for cur.Next(ctx) {
		var d struct {
			ID     string `bson:"_id"`
			Tenure int64  `bson:"tenure"`
			Schema int    `bson:"schema"`
		}
		if err := bson.Unmarshal(cur.Current, &d); err != nil {
			return nil, fmt.Errorf("read the fences: %w", err)
		}
		if err := checkSchema(s.Fences().Name(), d.ID, d.Schema); err != nil {
			return nil, err
		}
		p, err := strconv.Atoi(d.ID[len(fencePrefix):])
		if err != nil {
			continue
		}
		out[p] = d.Tenure
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("read the fences: %w", err)
	}
	return out, nil
}

// fencePlan sorts the partitions a read under tenures may claim in
// (those of owned, or every one with a tenure where owned is nil): those
// whose fence this store must raise before the read, and those the fence
// refused this tenure already, which the read leaves out.
func (f *fences) plan(tenures []int64, owned []bool) (raise, refused []int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for p, t := range tenures {
		if p >= events.Partitions || t == 0 || (owned != nil && (p >= len(owned) || !owned[p])) {
			continue
		}
		switch t {
		case f.refused[p]:
			refused = append(refused, p)
		case f.raised[p]:
		default:
			raise = append(raise, p)
		}
	}
	return raise, refused
}

// note records what the fences of ps answered: cur holds each one's tenure
// as read after a write that did not match them all (nil: they all
// matched). It returns the partitions whose fence is past tenures, held
// by a later owner, each with its fence's tenure.
func (f *fences) note(ps []int, tenures []int64, cur map[int]int64) (refused map[int]int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range ps {
		t, ok := cur[p]
		switch {
		case cur == nil || (ok && t == tenures[p]):
			f.raised[p] = max(f.raised[p], tenures[p])
		case ok && t > tenures[p]:
			f.refused[p] = tenures[p]
			if refused == nil {
				refused = map[int]int64{}
			}
			refused[p] = t
		}
	}
	return refused
}

// raiseFences raises the fence of each partition the read under limit is
// about to claim in to its tenure, where it has not yet (once per
// tenure), so that no claim of an earlier tenure commits after the read
// has begun: such a claim either committed before the raise, and the read
// sees what it claimed, or is refused. It returns the partitions the read
// may claim in: those of limit.Owned (every one with a tenure where it is
// nil) but the ones whose fence refused this tenure before; and ErrFenced
// when the fence refused some now.
func (s *Store) raiseFences(ctx context.Context, limit events.ClaimLimit) ([]bool, error) {
	raise, refused := s.fences.plan(limit.Tenures, limit.Owned)
	owned := make([]bool, events.Partitions)
	for p, t := range limit.Tenures {
		owned[p] = p < events.Partitions && t != 0 && (limit.Owned == nil || (p < len(limit.Owned) && limit.Owned[p]))
	}
	for _, p := range refused {
		owned[p] = false
	}
	if len(raise) == 0 {
		return owned, nil
	}
	all, err := s.writeFences(ctx, raise, limit.Tenures, false)
	if err != nil {
		return nil, err
	}
	if all {
		s.fences.note(raise, limit.Tenures, nil)
		return owned, nil
	}
	return nil, s.refusal(ctx, raise, limit.Tenures)
}

// refusal reads the fences of ps after a write under tenures did not
// match them all, records the answer, and returns the error to report:
// ErrFenced naming the partitions held under a later tenure, or, where
// fence documents are missing (deleted by hand), an error after creating
// them again.
func (s *Store) refusal(ctx context.Context, ps []int, tenures []int64) error {
	cur, err := s.readFences(ctx, ps)
	if err != nil {
		return err
	}
	if refused := s.fences.note(ps, tenures, cur); len(refused) > 0 {
		err := &events.FencedError{Fences: refused}
		s.logger.Warn("the database's fence refused a claim: another worker holds these partitions under a later tenure",
			"error", err)
		return err
	}
	if len(cur) < len(ps) {
		if _, err := s.ensureFences(ctx); err != nil {
			return err
		}
		return errors.New("fence documents were missing and are created again; the next claim writes them")
	}
	// Every fence is at or below the tenure now: a write of the fence
	// raced this one. Nothing was refused; the next claim tries again.
	return errors.New("the fences moved during the claim; the next claim tries again")
}

// fencedWrite runs fn, a claim's write of docs, in one transaction with
// the fence of every partition of docs, where the claim is fenced (see
// fencing): the fences first, so that a concurrent write of them conflicts
// before the claim's update runs. When a fence is held under a later
// tenure, nothing is committed and the error wraps events.ErrFenced.
func (s *Store) fencedWrite(ctx context.Context, limit events.ClaimLimit, docs []events.Claimed, fn func(ctx context.Context) error) error {
	return s.fencedIn(ctx, limit, claimPartitions(docs), fn)
}

// fencedIn is fencedWrite of a write in partitions ps, ascending.
func (s *Store) fencedIn(ctx context.Context, limit events.ClaimLimit, ps []int, fn func(ctx context.Context) error) error {
	if !s.fencing(limit) {
		return fn(ctx)
	}
	for _, p := range ps {
		if p >= len(limit.Tenures) || limit.Tenures[p] == 0 {
			return fmt.Errorf("claim in partition %d, which the claim holds under no tenure", p)
		}
	}
	errMoved := errors.New("fence moved")
	err := s.inTransaction(ctx, func(ctx context.Context) error {
		all, err := s.writeFences(ctx, ps, limit.Tenures, true)
		if err != nil {
			return err
		}
		if !all {
			return errMoved
		}
		return fn(ctx)
	})
	if errors.Is(err, errMoved) {
		return s.refusal(ctx, ps, limit.Tenures)
	}
	if err == nil {
		s.fences.note(ps, limit.Tenures, nil)
	}
	return err
}

// claimPartitions returns the partitions of docs, ascending, each once:
// the order every fenced write takes them in.
func claimPartitions(docs []events.Claimed) []int {
	var seen [events.Partitions]bool
	var ps []int
	for _, c := range docs {
		if p := events.Partition(c.Doc); !seen[p] {
			seen[p] = true
			ps = append(ps, p)
		}
	}
	slices.Sort(ps)
	return ps
}
