package mongo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/outboxrelay/outbox/events"
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
	// txnOpts are the options of every transaction (inTransaction).
	txnOpts *options.TransactionOptionsBuilder
}

// New returns a Store on client. It does no I/O: call Prepare before use.
func New(client *mongo.Client, cfg Config) *Store {
	cfg.setDefaults()
	return &Store{
		client: client,
		coll:   client.Database(cfg.Database).Collection(cfg.Collection),
		logger: cfg.Logger,
		txnOpts: options.Transaction().
			SetReadPreference(readpref.Primary()).
			SetReadConcern(cfg.ReadConcern).
			SetWriteConcern(cfg.WriteConcern),
	}
}

// Prepare finds out whether the deployment supports transactions and
// creates the indexes the worker's queries rely on. It is idempotent and
// safe to run from every replica at once.
func (s *Store) Prepare(ctx context.Context) error {
	txn, err := supportsTransactions(ctx, s.client)
	if err != nil {
		return err
	}
	s.txn = txn
	return s.ensureIndexes(ctx)
}

// supportsTransactions asks the server what it is: transactions need a
// replica set member (setName) or a mongos router (msg "isdbgrid"). A
// standalone server, and FerretDB, report neither.
func supportsTransactions(ctx context.Context, client *mongo.Client) (bool, error) {
	var hello struct {
		SetName string `bson:"setName"`
		Msg     string `bson:"msg"`
	}
	err := client.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello)
	if err != nil {
		return false, fmt.Errorf("ask the server what it is (hello): %w", err)
	}
	return hello.SetName != "" || hello.Msg == "isdbgrid", nil
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

func (s *Store) ensureIndexes(ctx context.Context) error {
	models := []mongo.IndexModel{
		// Claim: NEW events, oldest first.
		{Keys: bson.D{{Key: events.FieldStatus, Value: 1}, {Key: events.FieldCreatedAt, Value: 1}},
			Options: options.Index().SetName("outbox_claim")},
		// Recovery: PROCESSING events by claim time.
		{Keys: bson.D{{Key: events.FieldStatus, Value: 1}, {Key: events.FieldProcessingAt, Value: 1}},
			Options: options.Index().SetName("outbox_stale")},
		// Retention: PUBLISHED events by publish time.
		{Keys: bson.D{{Key: events.FieldStatus, Value: 1}, {Key: events.FieldPublishedAt, Value: 1}},
			Options: options.Index().SetName("outbox_retention")},
	}
	// One command per index: FerretDB v1.24.0 panics (and drops the
	// connection) on a createIndexes naming two or more indexes that
	// already exist, which is every start but the first. On MongoDB this
	// costs two more commands at start.
	for _, m := range models {
		if _, err := s.coll.Indexes().CreateOne(ctx, m); err != nil {
			return fmt.Errorf("create indexes on %s: %w", s.coll.Name(), err)
		}
	}
	return nil
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
