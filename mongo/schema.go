package mongo

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
)

// indexSpec is an index the worker's queries rely on.
type indexSpec struct {
	name string
	keys bson.D
}

// collectionSpec is a collection the worker uses, named by its suffix
// after the outbox collection ("" is the outbox collection itself), with
// its indexes.
type collectionSpec struct {
	suffix  string
	indexes []indexSpec
	// forRun: worker run needs it to exist before it starts (its writes
	// would otherwise create it, which a least-privilege role may not).
	forRun bool
	// txnOnly: only where the deployment has transactions.
	txnOnly bool
}

// outboxIndexes are the indexes of the outbox collection. worker setup
// creates them and worker run checks them: a new index is one more line
// here, and both see it.
var outboxIndexes = []indexSpec{
	// NEW events, oldest first: the claim of workers before the split
	// claim below (kept for a rolling upgrade), and the sampler's
	// oldest NEW event.
	{newByAgeIndex, bson.D{{Key: events.FieldStatus, Value: 1}, {Key: events.FieldCreatedAt, Value: 1}}},
	// The claims of workers before the lane (kept for a rolling
	// upgrade): NEW events never retried (retryAt null) oldest first,
	// and the due retries by retryAt.
	{claimIndex, bson.D{{Key: events.FieldStatus, Value: 1}, {Key: events.FieldRetryAt, Value: 1}, {Key: events.FieldCreatedAt, Value: 1}}},
	// Their ordered claim: as outbox_claim_retry, with the _id
	// tiebreak (kept for a rolling upgrade too; the sampler's held
	// count reads through it).
	{claimOrderIndex, bson.D{{Key: events.FieldStatus, Value: 1}, {Key: events.FieldRetryAt, Value: 1}, {Key: events.FieldCreatedAt, Value: 1}, {Key: events.FieldID, Value: 1}}},
	// The claim's lane (readHead): equality on status, parked and
	// retryAt, the owned partitions as an $in that MongoDB merges in
	// {createdAt, _id} order, so that a claim examines what it returns.
	{laneIndex, bson.D{{Key: events.FieldStatus, Value: 1}, {Key: events.FieldParked, Value: 1}, {Key: events.FieldRetryAt, Value: 1}, {Key: events.FieldPartition, Value: 1}, {Key: events.FieldCreatedAt, Value: 1}, {Key: events.FieldID, Value: 1}}},
	// Recovery: PROCESSING events by claim time.
	{"outbox_stale", bson.D{{Key: events.FieldStatus, Value: 1}, {Key: events.FieldProcessingAt, Value: 1}}},
	// Retention: PUBLISHED events by publish time.
	{retentionIndex, bson.D{{Key: events.FieldStatus, Value: 1}, {Key: events.FieldPublishedAt, Value: 1}}},
	// The sequence checks of a claim whose batch has events with a
	// sequence (sequence.go): an aggregate's NEW events below, and its
	// PUBLISHED events at or above, a version.
	{sequenceIndex, bson.D{{Key: events.FieldStatus, Value: 1}, {Key: events.FieldAggregateID, Value: 1}, {Key: events.FieldSequence, Value: 1}}},
}

// sequenceIndex serves the claim's sequence checks.
const sequenceIndex = "outbox_sequence"

// schema is every collection and index of the outbox: what worker setup
// creates, and, of it, what worker run checks (forRun).
var schema = []collectionSpec{
	{suffix: "", indexes: outboxIndexes, forRun: true},
	{suffix: OwnersSuffix, forRun: true},
	{suffix: FencesSuffix, forRun: true, txnOnly: true},
	{suffix: PausedSuffix},
	{suffix: AuditSuffix},
}

// Missing is a collection or an index of the schema that does not exist.
type Missing struct {
	// Collection is the collection's full name, database.collection.
	Collection string
	// Index is the index's name; "" when the collection itself is
	// missing.
	Index string
	keys  bson.D
}

func (m Missing) String() string {
	if m.Index == "" {
		return "collection " + m.Collection
	}
	return fmt.Sprintf("index %s %s on %s", m.Index, keysString(m.keys), m.Collection)
}

// keysString is an index's keys as the shell writes them: {status: 1, createdAt: 1}.
func keysString(keys bson.D) string {
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s: %v", k.Key, k.Value)
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// MissingError is worker run's refusal to start without what it needs.
type MissingError struct{ Missing []Missing }

func (e *MissingError) Error() string {
	parts := make([]string, len(e.Missing))
	for i, m := range e.Missing {
		parts[i] = m.String()
	}
	return "the database lacks what the worker needs: " + strings.Join(parts, "; ") +
		". Run `worker setup` (with the same OUTBOX_MONGO_* settings) as a user that may create collections and indexes, then start the worker again (docs/upgrading.md)"
}

// specs returns the collections of the schema for this deployment, with
// their full names: all of them, or only those worker run needs.
func (s *Store) specs(forRun bool) []collectionSpec {
	var out []collectionSpec
	for _, c := range schema {
		if (c.txnOnly && !s.txn) || (forRun && !c.forRun) {
			continue
		}
		out = append(out, c)
	}
	return out
}

func (s *Store) collection(suffix string) *mongo.Collection {
	return s.coll.Database().Collection(s.coll.Name() + suffix)
}

func (s *Store) fullName(suffix string) string {
	return s.coll.Database().Name() + "." + s.coll.Name() + suffix
}

// Missing lists what worker run needs and does not find: the
// collections it writes and the indexes its queries rely on. It only
// lists indexes (listIndexes), which a role that may read the
// collections may do. Call Detect first: the fence collection is needed
// only where the deployment has transactions.
func (s *Store) Missing(ctx context.Context) ([]Missing, error) {
	return s.missing(ctx, s.specs(true))
}

func (s *Store) missing(ctx context.Context, specs []collectionSpec) ([]Missing, error) {
	var out []Missing
	for _, c := range specs {
		names, exists, err := indexNamesOf(ctx, s.collection(c.suffix))
		if err != nil {
			return nil, err
		}
		if !exists {
			out = append(out, Missing{Collection: s.fullName(c.suffix)})
		}
		for _, ix := range c.indexes {
			if !names[ix.name] {
				out = append(out, Missing{Collection: s.fullName(c.suffix), Index: ix.name, keys: ix.keys})
			}
		}
	}
	return out, nil
}

// Setup creates what is missing of the schema, for this deployment: the
// collections, their indexes and, where the deployment has transactions,
// the fence documents. It returns what it did, one line each (none when
// everything was there). It is idempotent and safe to run from several
// processes at once: what another created meanwhile is no error.
func (s *Store) Setup(ctx context.Context) ([]string, error) {
	if err := s.Detect(ctx); err != nil {
		return nil, err
	}
	missing, err := s.missing(ctx, s.specs(false))
	if err != nil {
		return nil, err
	}
	var done []string
	for _, m := range missing {
		if err := s.create(ctx, m); err != nil {
			return done, err
		}
		done = append(done, "created "+m.String())
	}
	if s.txn {
		n, err := s.ensureFences(ctx)
		if err != nil {
			return done, err
		}
		if n > 0 {
			done = append(done, fmt.Sprintf("created %d fence documents in %s", n, s.fullName(FencesSuffix)))
		}
	}
	return done, nil
}

// create creates one missing collection or index. Indexes are created
// one per command: FerretDB v1.24.0 panics (and drops the connection) on
// a createIndexes naming two or more indexes that already exist, which
// another replica starting at the same moment may have just made so.
func (s *Store) create(ctx context.Context, m Missing) error {
	_, name, _ := strings.Cut(m.Collection, ".")
	coll := s.coll.Database().Collection(name)
	if m.Index == "" {
		err := s.coll.Database().CreateCollection(ctx, name)
		var ce mongo.CommandError
		if errors.As(err, &ce) && ce.Code == namespaceExists {
			return nil
		}
		if err != nil {
			return fmt.Errorf("create collection %s: %w", m.Collection, err)
		}
		return nil
	}
	model := mongo.IndexModel{Keys: m.keys, Options: options.Index().SetName(m.Index)}
	if _, err := coll.Indexes().CreateOne(ctx, model); err != nil {
		return fmt.Errorf("create index %s on %s: %w", m.Index, m.Collection, err)
	}
	return nil
}

// namespaceExists is the server's error code for a collection created
// already.
const namespaceExists = 48

// indexNamesOf lists the names of coll's indexes, and whether coll
// exists: a collection has at least its _id index, and MongoDB answers
// NamespaceNotFound where there is none, FerretDB an empty list. It
// needs only listIndexes on coll, not listCollections on the database.
func indexNamesOf(ctx context.Context, coll *mongo.Collection) (map[string]bool, bool, error) {
	specs, err := coll.Indexes().ListSpecifications(ctx)
	var ce mongo.CommandError
	if errors.As(err, &ce) && ce.Code == namespaceNotFound {
		return map[string]bool{}, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("list indexes on %s: %w", coll.Name(), err)
	}
	names := make(map[string]bool, len(specs))
	for _, spec := range specs {
		names[spec.Name] = true
	}
	return names, len(names) > 0, nil
}

// FieldSchema is the field of the schema version on every document the
// worker owns: terms and heartbeats (owners), fences, paused types and
// audit records. The event documents are the producers' and have none.
const FieldSchema = "schema"

// SchemaVersion is the version of those documents this worker writes
// and the newest it reads. A document without the field is of version 1,
// written before the field existed. A change of their meaning that older
// workers would misread raises it; they then refuse such documents
// (NewerSchemaError) rather than misread them.
const SchemaVersion = 1

// NewerSchemaError is a document of a schema version this worker does
// not know: a newer worker wrote it.
type NewerSchemaError struct {
	Collection string
	ID         any
	Version    int
}

func (e *NewerSchemaError) Error() string {
	return fmt.Sprintf("document %v of %s has schema version %d, newer than the %d this worker knows: "+
		"a newer version of the worker wrote it; upgrade this worker (or roll the newer one back) rather than run both (docs/upgrading.md)",
		e.ID, e.Collection, e.Version, SchemaVersion)
}

// checkSchema returns a NewerSchemaError when version, a document's
// schema field (0 when absent), is newer than SchemaVersion.
func checkSchema(coll string, id any, version int) error {
	if version > SchemaVersion {
		return &NewerSchemaError{Collection: coll, ID: id, Version: version}
	}
	return nil
}

// PrepareRun readies the store for worker run: it learns what the
// deployment supports (Detect), checks that what the relay needs exists
// (Missing) and, where the deployment has transactions, writes the fence
// documents that are missing (data, which the relay's role may write).
// With create it creates what is missing, as worker setup would, and
// returns what it did; without it, and when creating is refused for
// want of privilege, it returns a *MissingError naming what is missing
// and the command to run. It creates nothing when nothing is missing, so
// a role that may not create collections or indexes runs the relay.
func (s *Store) PrepareRun(ctx context.Context, create bool) ([]string, error) {
	if err := s.Detect(ctx); err != nil {
		return nil, err
	}
	missing, err := s.Missing(ctx)
	if err != nil {
		return nil, err
	}
	if len(missing) > 0 && !create {
		return nil, &MissingError{Missing: missing}
	}
	var done []string
	for i, m := range missing {
		if err := s.create(ctx, m); err != nil {
			var ce mongo.CommandError
			if errors.As(err, &ce) && ce.Code == unauthorized {
				return done, fmt.Errorf("%w (creating them was refused: %v)", &MissingError{Missing: missing[i:]}, err)
			}
			return done, err
		}
		done = append(done, "created "+m.String())
	}
	if s.txn {
		if _, err := s.ensureFences(ctx); err != nil {
			return done, err
		}
	}
	return done, nil
}

// unauthorized is the server's error code for a command the user's roles
// do not allow.
const unauthorized = 13

// HasBrowseIndex reports whether the console's index exists (see
// EnsureBrowseIndex), for worker setup --console to say what it did.
func (s *Store) HasBrowseIndex(ctx context.Context) (bool, error) {
	names, err := s.indexNames(ctx)
	return names[browseIndex], err
}
