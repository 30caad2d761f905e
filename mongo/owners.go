package mongo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/ownership"
)

// OwnersSuffix names the owners collection after the outbox collection:
// "<collection>_owners".
const OwnersSuffix = "_owners"

// memberPrefix starts the _id of a member's heartbeat document; a term's
// _id is "<partition>/<term>".
const memberPrefix = "member/"

// Owners is the collection of partition terms and replica heartbeats
// (package ownership). It holds about two terms per partition and one
// document per replica.
type Owners struct {
	coll   *mongo.Collection
	logger *slog.Logger
	// older are the replicas whose heartbeat has an older schema than
	// this worker's, each logged once (see noteOlder).
	older sync.Map
}

// Owners returns the owners collection next to the outbox collection.
func (s *Store) Owners() *Owners {
	return &Owners{coll: s.coll.Database().Collection(s.coll.Name() + OwnersSuffix), logger: s.logger}
}

// Collection returns the owners collection.
func (o *Owners) Collection() *mongo.Collection { return o.coll }

// ownerDoc is a term or a member heartbeat as stored.
type ownerDoc struct {
	ID        string    `bson:"_id"`
	Partition int       `bson:"partition,omitempty"`
	Term      int64     `bson:"term,omitempty"`
	Owner     string    `bson:"owner,omitempty"`
	ExpiresAt time.Time `bson:"expiresAt,omitempty"`
	Released  bool      `bson:"released,omitempty"`
	CreatedAt time.Time `bson:"createdAt,omitempty"`
	WorkerID  string    `bson:"workerId,omitempty"`
	SeenAt    time.Time `bson:"seenAt,omitempty"`
	// Schema is the document's schema version (SchemaVersion); 0 in
	// documents written before it existed.
	Schema int `bson:"schema,omitempty"`
}

// ownersBatch is the reply batch of Read. The collection holds about two
// terms per partition (128) and a heartbeat per replica, so one reply
// carries it all; the default first batch (101) cost a getMore on every
// round of every replica.
const ownersBatch = 1000

// Read returns every term and member: one find over a small collection.
func (o *Owners) Read(ctx context.Context) ([]ownership.Term, []ownership.Member, error) {
	cur, err := o.coll.Find(ctx, bson.D{}, options.Find().SetBatchSize(ownersBatch))
	if err != nil {
		return nil, nil, fmt.Errorf("find owners: %w", err)
	}
	defer closeCursor(ctx, cur)
	return o.readOwners(ctx, cur)
}

// readOwners decodes Read's documents into terms and members.
func (o *Owners) readOwners(ctx context.Context, cur *mongo.Cursor) ([]ownership.Term, []ownership.Member, error) {
	var terms []ownership.Term
	var members []ownership.Member
	for cur.Next(ctx) {
		// bson.Unmarshal decodes the reply's bytes in place; the cursor's
		// All and Decode put each document behind a new bufio.Reader, a
		// large share of the worker's garbage during a drain, since every
		// ownership round reads the owners (measured in
		// docs/performance.md, Where the CPU went).
		var d ownerDoc
		if err := bson.Unmarshal(cur.Current, &d); err != nil {
			return nil, nil, fmt.Errorf("read owners: %w", err)
		}
		if err := checkSchema("the owners collection", d.ID, d.Schema); err != nil {
			return nil, nil, err
		}
		if strings.HasPrefix(d.ID, memberPrefix) {
			members = append(members, ownership.Member{WorkerID: d.WorkerID, SeenAt: d.SeenAt})
			o.noteOlder(d)
			continue
		}
		terms = append(terms, ownership.Term{Partition: d.Partition, Term: d.Term, Owner: d.Owner, ExpiresAt: d.ExpiresAt, Released: d.Released})
	}
	if err := cur.Err(); err != nil {
		return nil, nil, fmt.Errorf("read owners: %w", err)
	}
	return terms, members, nil
}

// Insert inserts the terms in one unordered insert: each wins exactly when
// no document has its _id yet, on MongoDB and on FerretDB alike. A
// duplicate key is a lost term, not an error.
func (o *Owners) Insert(ctx context.Context, terms []ownership.Term) ([]bool, error) {
	won := make([]bool, len(terms))
	if len(terms) == 0 {
		return won, nil
	}
	docs := make([]any, len(terms))
	for i, t := range terms {
		won[i] = true
		docs[i] = ownerDoc{ID: t.ID(), Partition: t.Partition, Term: t.Term, Owner: t.Owner,
			ExpiresAt: t.ExpiresAt.UTC().Truncate(time.Millisecond), Released: t.Released, CreatedAt: time.Now().UTC().Truncate(time.Millisecond),
			Schema: SchemaVersion}
	}
	_, err := o.coll.InsertMany(ctx, docs, options.InsertMany().SetOrdered(false))
	if err == nil {
		return won, nil
	}
	var bwe mongo.BulkWriteException
	if !errors.As(err, &bwe) || bwe.WriteConcernError != nil || len(bwe.WriteErrors) == 0 {
		return nil, fmt.Errorf("insert %d terms: %w", len(terms), err)
	}
	for _, we := range bwe.WriteErrors {
		if !mongo.IsDuplicateKeyError(we) || we.Index < 0 || we.Index >= len(terms) {
			return nil, fmt.Errorf("insert %d terms: %w", len(terms), err)
		}
		won[we.Index] = false
	}
	return won, nil
}

// Heartbeat upserts m's document. Only m's own worker writes it, so the
// upsert has no racer.
func (o *Owners) Heartbeat(ctx context.Context, m ownership.Member) error {
	_, err := o.coll.UpdateOne(ctx,
		bson.D{{Key: "_id", Value: memberPrefix + m.WorkerID}},
		bson.D{{Key: "$set", Value: bson.D{
			{Key: "workerId", Value: m.WorkerID},
			{Key: "seenAt", Value: m.SeenAt.UTC().Truncate(time.Millisecond)},
			{Key: FieldSchema, Value: SchemaVersion},
		}}},
		options.UpdateOne().SetUpsert(true))
	if err != nil {
		return fmt.Errorf("write heartbeat: %w", err)
	}
	return nil
}

// Prune deletes the given terms and members' heartbeats in one command.
func (o *Owners) Prune(ctx context.Context, terms []ownership.Term, members []string) error {
	ids := make([]string, 0, len(terms)+len(members))
	for _, t := range terms {
		ids = append(ids, t.ID())
	}
	for _, m := range members {
		ids = append(ids, memberPrefix+m)
	}
	if len(ids) == 0 {
		return nil
	}
	if _, err := o.coll.DeleteMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}}); err != nil {
		return fmt.Errorf("delete %d old owner documents: %w", len(ids), err)
	}
	return nil
}

// noteOlder says once per replica that one of an earlier version shares
// the outbox, which a member's heartbeat of an older schema (none, before
// schema versions) shows: during a rolling upgrade between versions that
// may share it, what an operator expects; otherwise the upgrade notes
// say to stop the older replicas first (docs/upgrading.md).
func (o *Owners) noteOlder(d ownerDoc) {
	schema := max(d.Schema, 1) // none: written before schema versions, version 1
	if (d.Schema != 0 && schema >= SchemaVersion) || o.logger == nil {
		return
	}
	if _, seen := o.older.LoadOrStore(d.WorkerID, true); seen {
		return
	}
	if schema == SchemaVersion {
		o.logger.Info("a replica of an earlier version shares this outbox (its heartbeat has no schema version): expected during a rolling upgrade (docs/upgrading.md)",
			"replica", d.WorkerID)
		return
	}
	o.logger.Warn("a replica of an older schema shares this outbox: upgrade it, or stop it before this version relays, as the upgrade notes say (docs/upgrading.md)",
		"replica", d.WorkerID, "its_schema", schema, "this_schema", SchemaVersion)
}
