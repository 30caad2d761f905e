package mongo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/deployment"
)

const (
	// DatabaseDefault is the database the outbox lives in by default.
	DatabaseDefault = "outbox"
	// CollectionDefault is the outbox collection by default.
	CollectionDefault = "events"
)

// Config configures a Store.
type Config struct {
	// Database is the database holding the outbox collection.
	// Defaults to DatabaseDefault.
	Database string
	// Collection is the outbox collection. Defaults to CollectionDefault.
	Collection string
	// Logger receives the store's few log lines. Defaults to slog.Default().
	Logger *slog.Logger
	// ReadConcern and WriteConcern are those of the store's transactions,
	// which also read from the primary: set on the transaction, they hold
	// whatever the client's defaults are. Default to majority, and to
	// majority with the journal.
	ReadConcern  *readconcern.ReadConcern
	WriteConcern *writeconcern.WriteConcern
	// SequenceAnomaly, when set, is told how many events (or aggregates)
	// of each kind a claim found out of sequence: events.SequenceReordered,
	// SequenceBehind, SequenceRepeat, SequenceMixed or SequenceWaiting
	// (sequence.go). Defaults to nil: behind and repeat are only logged.
	SequenceAnomaly func(kind string, n int)
}

func (c *Config) setDefaults() {
	if c.Database == "" {
		c.Database = DatabaseDefault
	}
	if c.Collection == "" {
		c.Collection = CollectionDefault
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.ReadConcern == nil {
		c.ReadConcern = readconcern.Majority()
	}
	if c.WriteConcern == nil {
		journal := true
		c.WriteConcern = &writeconcern.WriteConcern{W: "majority", Journal: &journal}
	}
}

// Store is the outbox collection.
type Store struct {
	client *mongo.Client
	coll   *mongo.Collection
	logger *slog.Logger
	txn    bool
	// lane is how the claims read and write their lane on this server
	// (dialect.go): FerretDB's until Detect finds MongoDB.
	lane laneDialect
	// ferret is a FerretDB server: it accepts $push's $slice and ignores
	// it (trimAttempts), and knows no $dateTrunc (PublishedPerMinute).
	ferret bool
	// onePassStats counts the backlog in one read (countInOnePass), where
	// the counts by index would each read all of it: on FerretDB.
	onePassStats bool
	skipped      skipSet
	// largestDoc is the largest document the last claim read, in bytes,
	// or a guess after a claim's find failed: it bounds the claim's
	// reply batches (see findBatch).
	largestDoc atomic.Int64
	// txnOpts are the options of every transaction (inTransaction).
	txnOpts *options.TransactionOptionsBuilder
	// heldWindow is heldWindow but in tests of the bound.
	heldWindow int
	// headReadMax is maxHeadRead where above 0 (tests).
	headReadMax int
	// readConcern is the level the commands timedFind sends carry: a
	// command run through RunCommand gets none from the client.
	readConcern string
	// writeConcern is that of the transactions, and of the writes of the
	// fences outside them (raiseFences).
	writeConcern *writeconcern.WriteConcern
	// fences is what this store knows of the partitions' fence documents
	// (fences.go), used only where the deployment has transactions.
	fences fences
	// pausedCache is the paused types the claims read last (paused.go).
	pausedCache pausedCache
	// parked is what the claims know of the parked events of the
	// partitions they own (lane.go).
	parked parkedKeys
	// unparking is the unpark steps still to write (unpark.go), at
	// most unparkStepsMax a claim where it is above 0 (tests).
	unparking      unparkQueue
	unparkStepsMax int
	// unwritten is what the last read of the lane found to park, until
	// the claimer holds the partitions to write it (parking.go).
	unwritten unwrittenParks
	// ahead is what the last read of the lane kept past its batch, for
	// the next claims of a drain (ahead.go).
	ahead readAhead
	// partitionReads says how the claims on FerretDB read their lane
	// (partitionreads.go).
	partitionReads partitionReads
	// chartMax and chartSize decide whether FerretDB draws the publish
	// chart (publishchart.go).
	chartMax  int64
	chartSize sizeCache
	// sequenceAnomaly is Config.SequenceAnomaly.
	sequenceAnomaly func(kind string, n int)
	// failedWrites makes this store's writes to FAILED events take turns
	// on FerretDB (failedTurn).
	failedWrites sync.Mutex
}

// failedTurn waits for this store's turn to write FAILED events, and
// returns the function that ends it. On FerretDB a guarded update is a
// read and then a rewrite of each whole document, so a cause stored
// (storeCauses) from a read made before a requeue would write the event
// back to FAILED, undoing the requeue it never saw: the console's own
// writes are kept apart. On MongoDB each write is atomic, and nothing
// waits.
func (s *Store) failedTurn() func() {
	if !s.ferret {
		return func() {}
	}
	s.failedWrites.Lock()
	return s.failedWrites.Unlock
}

// New returns a Store on client. It does no I/O: call Prepare before use.
func New(client *mongo.Client, cfg Config) *Store {
	cfg.setDefaults()
	return &Store{
		client:       client,
		coll:         client.Database(cfg.Database).Collection(cfg.Collection),
		logger:       cfg.Logger,
		heldWindow:   heldWindow,
		lane:         scannedLane{},
		chartMax:     PublishChartFerretMax,
		pausedCache:  pausedCache{maxAge: PausedTypesMaxAge},
		readConcern:  cfg.ReadConcern.Level,
		writeConcern: cfg.WriteConcern,
		txnOpts: options.Transaction().
			SetReadPreference(readpref.Primary()).
			SetReadConcern(cfg.ReadConcern).
			SetWriteConcern(cfg.WriteConcern),
		sequenceAnomaly: cfg.SequenceAnomaly,
	}
}

// Prepare finds out whether the deployment supports transactions and
// whether it is FerretDB, and creates the indexes the worker's queries
// rely on and, with transactions, the partitions' fence documents. It is
// idempotent and safe to run from every replica at once.
//
// Its commands that need nothing of each other run at once: through a
// slow link their round trips in a row were seconds of every start.
func (s *Store) Prepare(ctx context.Context) error {
	var detectErr, indexErr error
	var wg sync.WaitGroup
	wg.Go(func() { detectErr = s.Detect(ctx) })
	wg.Go(func() { indexErr = s.ensureIndexes(ctx) })
	wg.Wait()
	if err := errors.Join(detectErr, indexErr); err != nil {
		return err
	}
	if s.txn {
		_, err := s.ensureFences(ctx)
		return err
	}
	return nil
}

// Detect learns what the deployment supports (transactions; FerretDB and
// what it lacks) without writing anything: Prepare does it first, and a
// reader such as the console, which may hold read-only credentials, alone.
// Its two questions are asked at once.
func (s *Store) Detect(ctx context.Context) error {
	var txn, ferret bool
	var txnErr, ferretErr error
	var wg sync.WaitGroup
	wg.Go(func() { txn, txnErr = deployment.SupportsTransactions(ctx, s.client) })
	wg.Go(func() { ferret, ferretErr = deployment.IsFerretDB(ctx, s.client) })
	wg.Wait()
	if err := errors.Join(txnErr, ferretErr); err != nil {
		return err
	}
	s.txn, s.lane, s.ferret, s.onePassStats = txn, dialectFor(ferret), ferret, ferret
	return nil
}

// SupportsTransactions reports whether PUBLISHED writes run in a
// transaction. It is known once Prepare has run.
func (s *Store) SupportsTransactions() bool { return s.txn }

// Collection returns the outbox collection.
func (s *Store) Collection() *mongo.Collection { return s.coll }

// Ping checks that the server answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.client.Ping(ctx, nil); err != nil {
		return fmt.Errorf("ping mongodb: %w", err)
	}
	return nil
}

// ensureIndexes creates the indexes of the outbox collection that do
// not exist (outboxIndexes). Every replica prepares the collection at
// each start, so the indexes that exist are listed first and only the
// missing ones created: one command at a usual start.
func (s *Store) ensureIndexes(ctx context.Context) error {
	missing, err := s.missing(ctx, schema[:1])
	if err != nil {
		return err
	}
	for _, m := range missing {
		if m.Index == "" {
			continue // created with its first index
		}
		if err := s.create(ctx, m); err != nil {
			return err
		}
	}
	return nil
}

// indexNames lists the names of the outbox collection's indexes: none
// when the collection does not exist yet.
func (s *Store) indexNames(ctx context.Context) (map[string]bool, error) {
	names, _, err := indexNamesOf(ctx, s.coll)
	return names, err
}

// namespaceNotFound is the server's error code for a collection that does
// not exist.
const namespaceNotFound = 26

// newByAgeIndex is {status, createdAt}: the sampler's oldest NEW event and
// the held count's oldest NEW events name it as their hint.
const newByAgeIndex = "outbox_claim"

// retentionIndex is {status, publishedAt}: retention's find names it.
const retentionIndex = "outbox_retention"

// claimIndex is the index the split claim's finds named as their hint
// before the ordered claim; kept for a rolling upgrade.
const claimIndex = "outbox_claim_retry"

// laneIndex is {status, parked, retryAt, partition, createdAt, _id}: the
// claim's lane (readHead) names it as its hint.
const laneIndex = "outbox_claim_lane"

// claimOrderIndex is the index the split claim's finds name as their hint,
// and the held count's read of the events backing off.
const claimOrderIndex = "outbox_claim_order"

// skipSetMax bounds the events one store skips: each is a document so
// close to the size limit that no write fits, which a sane producer never
// makes; past the bound such events are read and dropped again by each
// claim, which costs a slot of the batch but stalls nothing.
const skipSetMax = 1000

// skipSet holds the ids of NEW events this store can neither claim nor
// mark FAILED, left out of its claims until the process restarts, and the
// ordering keys they hold: a skipped event is still NEW, so an ordered
// claim takes no later event of its aggregate.
type skipSet struct {
	mu   sync.Mutex
	ids  map[string]any
	keys map[string]bool
}

// add records id and its ordering key (none when ""), if there is room,
// and reports whether it did.
func (s *skipSet) add(id any, key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ids) >= skipSetMax {
		return false
	}
	if s.ids == nil {
		s.ids, s.keys = map[string]any{}, map[string]bool{}
	}
	s.ids[skipKey(id)] = id
	if key != "" {
		s.keys[key] = true
	}
	return true
}

// holdKeys adds the ordering keys of the skipped events to held.
func (s *skipSet) holdKeys(held map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.keys {
		held[k] = true
	}
}

// list returns the skipped ids, for a $nin.
func (s *skipSet) list() []any {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]any, 0, len(s.ids))
	for _, id := range s.ids {
		out = append(out, id)
	}
	return out
}

// leaseFilter matches the given events only while this lease still holds
// them: the fence every write after a claim goes through.
func leaseFilter(lease events.Lease, ids []any) bson.D {
	return bson.D{
		{Key: events.FieldStatus, Value: events.StatusProcessing},
		{Key: events.FieldClaimToken, Value: lease.Token},
		{Key: events.FieldWorkerID, Value: lease.WorkerID},
		{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: ids}}},
	}
}

// isNoDocuments reports whether err only says nothing matched.
func isNoDocuments(err error) bool { return errors.Is(err, mongo.ErrNoDocuments) }

func skipKey(id any) string { return fmt.Sprintf("%T/%v", id, id) }
