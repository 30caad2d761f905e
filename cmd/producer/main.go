// Command producer is a demo producer for `make dev` and docker-compose. At
// a steady rate it writes an order to the orders collection and an
// order.created event to the outbox with events.Insert, both in one
// transaction when the deployment has transactions (a replica set or
// mongos). Without them (a standalone server, FerretDB) it writes both
// without one and says so once. It stops on SIGINT or SIGTERM after
// finishing the order in flight.
//
// Every flag may also be set by its environment variable; a flag wins.
//
//	--mongo-uri   OUTBOX_MONGO_URI         default mongodb://localhost:27017
//	--database    OUTBOX_MONGO_DATABASE    default outbox
//	--collection  OUTBOX_MONGO_COLLECTION  default events
//	--rate        PRODUCER_RATE            orders per second, default 20
//	--count       PRODUCER_COUNT           orders to write, 0 (default) = until stopped
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/deployment"
	"github.com/outboxrelay/outbox/internal/envflag"
	"github.com/outboxrelay/outbox/internal/redact"
)

const (
	ordersCollection = "orders"
	// writeTimeout bounds one order and its event, including the commit.
	writeTimeout = 10 * time.Second
	// errorLogEvery rate-limits the log of failed writes.
	errorLogEvery = 10 * time.Second
)

type config struct {
	MongoURI   string
	Database   string
	Collection string
	Rate       float64
	Count      int
}

func main() { envflag.Main("producer", parseConfig, run) }

// parseConfig reads flags, then the environment for each flag not given.
func parseConfig(args []string, getenv func(string) string) (config, error) {
	var c config
	fs := envflag.NewSet("producer")
	fs.String(&c.MongoURI, "mongo-uri", "OUTBOX_MONGO_URI", "mongodb://localhost:27017", "MongoDB URI")
	fs.String(&c.Database, "database", "OUTBOX_MONGO_DATABASE", "outbox", "database of orders and the outbox")
	fs.String(&c.Collection, "collection", "OUTBOX_MONGO_COLLECTION", "events", "outbox collection")
	fs.Float64(&c.Rate, "rate", "PRODUCER_RATE", 20, "orders per second")
	fs.Int(&c.Count, "count", "PRODUCER_COUNT", 0, "orders to write; 0 means until stopped")
	if err := fs.Parse(args, getenv); err != nil {
		return config{}, err
	}
	switch {
	case c.Database == "":
		return config{}, errors.New("database (OUTBOX_MONGO_DATABASE) is empty")
	case c.Collection == "":
		return config{}, errors.New("collection (OUTBOX_MONGO_COLLECTION) is empty")
	case !(c.Rate > 0 && c.Rate <= 100_000):
		return config{}, fmt.Errorf("rate (PRODUCER_RATE) %v: want more than 0 and at most 100000", c.Rate)
	case c.Count < 0:
		return config{}, fmt.Errorf("count (PRODUCER_COUNT) %d: want 0 or more", c.Count)
	}
	return c, nil
}

func run(ctx context.Context, cfg config, logger *slog.Logger) error {
	client, err := mongo.Connect(options.Client().ApplyURI(cfg.MongoURI))
	if err != nil {
		return fmt.Errorf("connect to %s: %w", redact.URL(cfg.MongoURI), err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = client.Disconnect(dctx)
	}()

	txn, err := deployment.SupportsTransactions(ctx, client)
	if err != nil {
		return fmt.Errorf("%s: %w", redact.URL(cfg.MongoURI), err)
	}
	logger.Info("producer started", "mongo_uri", redact.URL(cfg.MongoURI), "database", cfg.Database,
		"collection", cfg.Collection, "rate", cfg.Rate, "count", cfg.Count, "transactions", txn)
	if !txn {
		logger.Warn("deployment has no transactions (not a replica set or mongos): " +
			"writing each order and its event without one, so a crash between them leaves an order without its event")
	}

	p := producer{
		client:       client,
		orders:       client.Database(cfg.Database).Collection(ordersCollection),
		outbox:       client.Database(cfg.Database).Collection(cfg.Collection),
		transactions: txn,
	}
	ticker := time.NewTicker(time.Duration(float64(time.Second) / cfg.Rate))
	defer ticker.Stop()

	var written, failed int
	var lastErrLog time.Time
	for {
		if err := p.writeOrder(ctx); err != nil {
			failed++
			if time.Since(lastErrLog) >= errorLogEvery {
				logger.Error("write order", "error", err, "failed_total", failed)
				lastErrLog = time.Now()
			}
		} else {
			written++
		}
		if cfg.Count > 0 && written == cfg.Count {
			logger.Info("producer done", "written", written, "failed", failed)
			return nil
		}
		select {
		case <-ctx.Done():
			logger.Info("producer stopped", "written", written, "failed", failed)
			return nil
		case <-ticker.C:
		}
	}
}

type producer struct {
	client       *mongo.Client
	orders       *mongo.Collection
	outbox       *mongo.Collection
	transactions bool
}

// writeOrder writes one new order and its order.created event. A stop
// signal does not cut it short: it gets writeTimeout to finish.
func (p producer) writeOrder(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()

	orderID := "o-" + bson.NewObjectID().Hex()
	order := bson.D{
		{Key: "_id", Value: orderID},
		{Key: "customerId", Value: fmt.Sprintf("c-%03d", rand.IntN(1000))},
		{Key: "totalCents", Value: int64(100 + rand.IntN(100_000))},
		{Key: "currency", Value: "EUR"},
		{Key: "createdAt", Value: time.Now().UTC()},
	}
	write := func(ctx context.Context) (any, error) {
		if _, err := p.orders.InsertOne(ctx, order); err != nil {
			return nil, fmt.Errorf("insert order: %w", err)
		}
		return events.Insert(ctx, p.outbox, events.Draft{
			Type:          "order.created",
			AggregateType: "order",
			AggregateID:   orderID,
			Payload:       order,
			Headers:       map[string]any{"source": "producer"},
		})
	}
	if !p.transactions {
		_, err := write(ctx)
		return err
	}
	sess, err := p.client.StartSession()
	if err != nil {
		return fmt.Errorf("start session: %w", err)
	}
	defer sess.EndSession(ctx)
	_, err = sess.WithTransaction(ctx, write)
	return err
}
