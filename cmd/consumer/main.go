// Command consumer is the demo consumer of `make dev` and docker-compose. It
// declares a durable queue bound with binding key "#" to the worker's topic
// exchange (declared here too, durable, as the worker declares it), with
// single active consumer, so that however many copies run, one at a time
// takes the queue's messages in the queue's order (docs/ordering.md),
// consumes every event through the inbox package, and logs every few
// seconds how many messages it processed and how many duplicates (by
// message_id) the inbox skipped: the figure an at-least-once relay keeps
// rare and a real consumer deduplicates on.
//
// Its handler records, per aggregate, the last message it processed
// (collection consumer_aggregates, an idempotent upsert), in the same
// transaction as the inbox record where the server has transactions
// (docker-compose's replica set), and before a unique insert of the
// record where it has not (make dev's FerretDB). It stops on SIGINT or
// SIGTERM and logs its totals.
//
// Every flag may also be set by its environment variable; a flag wins.
//
//	--amqp-url         OUTBOX_AMQP_URL           default amqp://guest:guest@localhost:5672/
//	--exchange         OUTBOX_AMQP_EXCHANGE      default events
//	--queue            CONSUMER_QUEUE            default outbox-demo-ordered
//	--queue-expires    CONSUMER_QUEUE_EXPIRES    delete the queue after this long unused (x-expires); 0 (default) never
//	--report-every     CONSUMER_REPORT_EVERY     default 5s
//	--mongo-uri        OUTBOX_MONGO_URI          default mongodb://localhost:27017
//	--database         OUTBOX_MONGO_DATABASE     default outbox
//	--inbox-collection CONSUMER_INBOX_COLLECTION default inbox
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/broker"
	"github.com/outboxrelay/outbox/events/inbox"
	"github.com/outboxrelay/outbox/internal/backoff"
	"github.com/outboxrelay/outbox/internal/envflag"
	"github.com/outboxrelay/outbox/internal/redact"
	"github.com/outboxrelay/outbox/schedule"
)

const (
	// bindingKey matches every routing key, i.e. every event type.
	bindingKey = "#"
	// prefetch bounds the unacknowledged messages in flight to this
	// consumer; the inbox acknowledges up to inbox.AckBatchDefault at once.
	prefetch = 500
	// dialTimeout bounds one connection attempt.
	dialTimeout = 5 * time.Second
	// reconnectMax caps the wait between reconnects.
	reconnectMax = 30 * time.Second
	// aggregatesCollection is the demo handler's business collection.
	aggregatesCollection = "consumer_aggregates"
	// queueDefault is the demo queue. It is declared with
	// x-single-active-consumer, which an existing queue cannot gain: a
	// queue of an older demo (outbox-demo) keeps its arguments, so the
	// demo moved to a new name rather than fail to declare.
	queueDefault = "outbox-demo-ordered"
)

// queueArgs are the arguments of the demo queue: single active consumer
// (several consumers may attach, RabbitMQ delivers to one at a time and
// fails over to the next in the queue's order), and x-expires when set.
func queueArgs(expires time.Duration) amqp.Table {
	args := amqp.Table{"x-single-active-consumer": true}
	if expires > 0 {
		args["x-expires"] = expires.Milliseconds()
	}
	return args
}

type config struct {
	AMQPURL         string
	Exchange        string
	Queue           string
	QueueExpires    time.Duration
	ReportEvery     time.Duration
	MongoURI        string
	Database        string
	InboxCollection string
}

func main() { envflag.Main("consumer", parseConfig, run) }

// parseConfig reads flags, then the environment for each flag not given.
func parseConfig(args []string, getenv func(string) string) (config, error) {
	var c config
	fs := envflag.NewSet("consumer")
	fs.String(&c.AMQPURL, "amqp-url", "OUTBOX_AMQP_URL", "amqp://guest:guest@localhost:5672/", "RabbitMQ URL")
	fs.String(&c.Exchange, "exchange", "OUTBOX_AMQP_EXCHANGE", broker.ExchangeDefault, "topic exchange the worker publishes to")
	fs.String(&c.Queue, "queue", "CONSUMER_QUEUE", queueDefault, "durable single-active-consumer queue to declare, bind with \"#\" and consume; an existing queue must have been declared with the same arguments")
	fs.Duration(&c.QueueExpires, "queue-expires", "CONSUMER_QUEUE_EXPIRES", 0, "let RabbitMQ delete the queue after this long without consumers (x-expires); 0 keeps it")
	fs.Duration(&c.ReportEvery, "report-every", "CONSUMER_REPORT_EVERY", 5*time.Second, "how often to log the counts")
	fs.String(&c.MongoURI, "mongo-uri", "OUTBOX_MONGO_URI", "mongodb://localhost:27017", "MongoDB holding the inbox and the handler's writes")
	fs.String(&c.Database, "database", "OUTBOX_MONGO_DATABASE", "outbox", "database of the inbox and the handler's collection")
	fs.String(&c.InboxCollection, "inbox-collection", "CONSUMER_INBOX_COLLECTION", inbox.CollectionDefault, "collection of processed message ids")
	if err := fs.Parse(args, getenv); err != nil {
		return config{}, err
	}
	switch {
	case !strings.HasPrefix(c.AMQPURL, "amqp://") && !strings.HasPrefix(c.AMQPURL, "amqps://"):
		return config{}, fmt.Errorf("amqp URL (OUTBOX_AMQP_URL) %q: want amqp://user:password@host:port/vhost", redact.URL(c.AMQPURL))
	case !strings.HasPrefix(c.MongoURI, "mongodb://") && !strings.HasPrefix(c.MongoURI, "mongodb+srv://"):
		return config{}, fmt.Errorf("mongo URI (OUTBOX_MONGO_URI) %q: want mongodb://host:port", redact.URL(c.MongoURI))
	case c.Database == "":
		return config{}, errors.New("database (OUTBOX_MONGO_DATABASE) is empty")
	case c.InboxCollection == "":
		return config{}, errors.New("inbox collection (CONSUMER_INBOX_COLLECTION) is empty")
	case c.Exchange == "":
		return config{}, errors.New("exchange (OUTBOX_AMQP_EXCHANGE) is empty")
	case c.Queue == "":
		return config{}, errors.New("queue (CONSUMER_QUEUE) is empty")
	case c.QueueExpires < 0 || (c.QueueExpires > 0 && c.QueueExpires < time.Millisecond):
		return config{}, fmt.Errorf("queue expiry (CONSUMER_QUEUE_EXPIRES) %s: want 0 or at least 1ms", c.QueueExpires)
	case c.ReportEvery < 100*time.Millisecond:
		return config{}, fmt.Errorf("report interval (CONSUMER_REPORT_EVERY) %s: want at least 100ms", c.ReportEvery)
	}
	return c, nil
}

// handler is the demo's business logic: it records, per aggregate, the
// last message processed. The upsert is idempotent, as the inbox asks of
// handlers where the server has no transactions.
func handler(coll *mongo.Collection) inbox.Handler {
	return func(ctx context.Context, d amqp.Delivery) error {
		key, _ := d.Headers["x-aggregate-id"].(string)
		if key == "" {
			key = d.MessageId
		}
		_, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: key}}, bson.D{{Key: "$set", Value: bson.D{
			{Key: "lastMessageId", Value: d.MessageId},
			{Key: "type", Value: d.Type},
			{Key: "processedAt", Value: time.Now().UTC()},
		}}}, options.UpdateOne().SetUpsert(true))
		return err
	}
}

// reporter logs the inbox's counts since the last report and in total.
type reporter struct {
	in   *inbox.Inbox
	last inbox.Stats
}

func (r *reporter) report(logger *slog.Logger, msg string) {
	s := r.in.Stats()
	logger.Info(msg,
		"processed", s.Processed-r.last.Processed,
		"duplicates_skipped", s.Duplicates-r.last.Duplicates,
		"processed_total", s.Processed,
		"duplicates_skipped_total", s.Duplicates,
		"handler_errors_total", s.HandlerErrors,
		"rejected_total", s.Rejected,
	)
	r.last = s
}

// run starts the inbox, then consumes until ctx ends, reconnecting to
// RabbitMQ with backoff whenever the connection drops, and logs the totals
// when it stops. The inbox's Start is retried too: the database may come
// up after the consumer.
func run(ctx context.Context, cfg config, logger *slog.Logger) error {
	logger = logger.With("exchange", cfg.Exchange, "queue", cfg.Queue)
	logger.Info("consumer starting", "amqp_url", redact.URL(cfg.AMQPURL), "mongo_uri", redact.URL(cfg.MongoURI),
		"database", cfg.Database, "inbox_collection", cfg.InboxCollection, "binding_key", bindingKey)
	client, err := mongo.Connect(options.Client().ApplyURI(cfg.MongoURI).SetAppName("outbox-demo-consumer").
		SetMaxPoolSize(10).SetServerSelectionTimeout(dialTimeout))
	if err != nil {
		return fmt.Errorf("mongo client for %s: %w", redact.URL(cfg.MongoURI), err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dialTimeout)
		defer cancel()
		_ = client.Disconnect(dctx)
	}()
	in, err := inbox.New(client, handler(client.Database(cfg.Database).Collection(aggregatesCollection)), inbox.Config{
		Database:   cfg.Database,
		Collection: cfg.InboxCollection,
		// The queue consume declares: the inbox reads x-delivery-count only
		// from a quorum queue, where the broker writes it.
		QueueType: inbox.QueueTypeOf(queueArgs(cfg.QueueExpires)),
		Logger:    logger,
	})
	if err != nil {
		return err
	}
	if !retry(ctx, logger, "mongodb unavailable; retrying", in.Start) {
		return nil
	}
	// Shutdown order: Run returns once ctx ends (after acknowledging what
	// it committed), then the inbox's cleanup job stops.
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dialTimeout)
		defer cancel()
		_ = in.Stop(sctx)
	}()

	r := &reporter{in: in}
	defer r.report(logger, "consumer stopped")
	reports := make(chan struct{})
	go func() {
		defer close(reports)
		schedule.Every(ctx, cfg.ReportEvery, func(context.Context) { r.report(logger, "messages processed") })
	}()
	defer func() { <-reports }()

	retry(ctx, logger, "rabbitmq unavailable; reconnecting", func(ctx context.Context) error {
		return consume(ctx, cfg, logger, in)
	})
	return nil
}

// retry calls fn until it returns nil or ctx ends, waiting from 500ms up to
// reconnectMax between calls; it reports whether fn succeeded.
func retry(ctx context.Context, logger *slog.Logger, msg string, fn func(context.Context) error) bool {
	wait := backoff.Backoff{Min: 500 * time.Millisecond, Max: reconnectMax}
	for {
		err := fn(ctx)
		if ctx.Err() != nil {
			return false
		}
		if err == nil {
			return true
		}
		d := wait.Next()
		logger.Warn(msg, "error", err, "retry_in", d.String())
		if !backoff.Sleep(ctx, d) {
			return false
		}
	}
}

// consume runs one connection: it declares the exchange, the queue and the
// binding, then hands the deliveries to the inbox until ctx ends or the
// connection drops (an error: retry reconnects).
func consume(ctx context.Context, cfg config, logger *slog.Logger, in *inbox.Inbox) error {
	conn, err := amqp.DialConfig(cfg.AMQPURL, amqp.Config{
		Dial:       amqp.DefaultDial(dialTimeout),
		Heartbeat:  10 * time.Second,
		Properties: amqp.Table{"connection_name": "outbox-demo-consumer"},
	})
	if err != nil {
		return fmt.Errorf("dial %s: %w", redact.URL(cfg.AMQPURL), err)
	}
	// Closing the connection hands unacknowledged deliveries back to the
	// queue; the inbox skips those it had committed.
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	// The same declaration as the worker's: a mismatch would close the channel.
	if err := ch.ExchangeDeclare(cfg.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %q: %w", cfg.Exchange, err)
	}
	// Single active consumer keeps the queue's order across copies of
	// this consumer; the inbox's Run handles one delivery at a time, so
	// the handler sees each aggregate's events in the order they were
	// published (duplicates skipped).
	if _, err := ch.QueueDeclare(cfg.Queue, true, false, false, false, queueArgs(cfg.QueueExpires)); err != nil {
		// A queue declared before with other arguments cannot be
		// redeclared (PRECONDITION_FAILED): say what to do.
		return fmt.Errorf("declare queue %q (an existing queue must have x-single-active-consumer; use a new --queue or delete it): %w", cfg.Queue, err)
	}
	if err := ch.QueueBind(cfg.Queue, bindingKey, cfg.Exchange, false, nil); err != nil {
		return fmt.Errorf("bind queue %q to %q: %w", cfg.Queue, cfg.Exchange, err)
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return fmt.Errorf("set prefetch: %w", err)
	}
	deliveries, err := ch.ConsumeWithContext(ctx, cfg.Queue, "", false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume %q: %w", cfg.Queue, err)
	}
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	logger.Info("consuming", "transactional", in.Transactional())
	err = in.Run(ctx, deliveries)
	if ctx.Err() != nil {
		return nil
	}
	if err != nil {
		return err
	}
	select {
	case e := <-connClosed:
		if e != nil {
			return fmt.Errorf("connection closed: %w", e)
		}
	default:
	}
	return errors.New("deliveries stopped")
}
