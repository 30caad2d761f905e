package inbox

import (
	"cmp"
	"fmt"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/outbox/events/internal/rule"
)

const (
	// DatabaseDefault is the database of the inbox collections.
	DatabaseDefault = "outbox"
	// CollectionDefault is the collection of processed message ids. The
	// attempts of failing messages live beside it, in CollectionDefault
	// + AttemptsSuffix.
	CollectionDefault = "inbox"
	// AttemptsSuffix names the attempts collection after the inbox one.
	AttemptsSuffix = "_attempts"
	// MaxAttemptsDefault is how many times a message's handler runs before
	// the message is rejected.
	MaxAttemptsDefault = 5
	// RetentionDefault is how long a processed id is remembered. It matches
	// the relay's default retention of PUBLISHED events (seven days), the
	// longest an operator is likely to requeue an event after.
	RetentionDefault = 7 * 24 * time.Hour
	// RetentionMin is the shortest Retention Validate accepts: a worker's
	// stale-claim recovery alone can redeliver minutes later.
	RetentionMin = time.Hour
	// CleanupIntervalDefault is how often expired records are deleted where
	// the server has no TTL indexes.
	CleanupIntervalDefault = time.Minute
	// AckBatchDefault is how many settled messages Run acknowledges with one
	// multiple-ack.
	AckBatchDefault = 100
	// RetryPauseDefault is how long Run pauses after the database failed
	// (not the handler) before it takes the next message.
	RetryPauseDefault = time.Second
)

// Queue types, for Config.QueueType: the x-queue-type the consumer declared
// its queue with.
const (
	// QueueClassic is a classic queue: RabbitMQ keeps no delivery count, so
	// an x-delivery-count header on a delivery is whatever its publisher
	// wrote, and the inbox counts attempts itself.
	QueueClassic = "classic"
	// QueueQuorum is a quorum queue: RabbitMQ writes x-delivery-count on
	// every redelivery, over any value the publisher wrote.
	QueueQuorum = "quorum"
)

// QueueTypeOf returns the queue type that args, the arguments a queue is
// declared with, give it: QueueQuorum for x-queue-type "quorum",
// QueueClassic otherwise. Pass the same arguments the consumer declares its
// queue with, so the inbox knows what it consumes from:
//
//	args := amqp.Table{"x-queue-type": "quorum"}
//	_, err := ch.QueueDeclare("orders", true, false, false, false, args)
//	in, err := inbox.New(client, handle, inbox.Config{QueueType: inbox.QueueTypeOf(args)})
func QueueTypeOf(args amqp.Table) string {
	if t, _ := args["x-queue-type"].(string); t == QueueQuorum {
		return QueueQuorum
	}
	return QueueClassic
}

// Config configures an Inbox. The zero value is usable: New applies the
// defaults.
type Config struct {
	// Database holds the inbox collections. Defaults to DatabaseDefault.
	// With transactions, the handler's writes commit with the inbox
	// record only if they go through the same client.
	Database string
	// Collection holds one document per processed message id.
	// Defaults to CollectionDefault.
	Collection string
	// MaxAttempts is how many times a message's handler may fail before the
	// message is rejected with requeue=false (dead-lettered where the queue
	// has a dead-letter exchange, dropped otherwise). At most 1000.
	// Defaults to MaxAttemptsDefault.
	MaxAttempts int
	// QueueType is the type of the queue the deliveries come from
	// (QueueClassic or QueueQuorum; QueueTypeOf reads it from the queue's
	// declaration arguments). It decides who counts a message's attempts:
	// on a quorum queue the broker's x-delivery-count header on a
	// redelivery (a first delivery is the first attempt, whatever its
	// header says: the broker writes none there); on a classic queue the
	// inbox's attempts collection, and an x-delivery-count header there is
	// ignored, because only the publisher can have written it. A quorum
	// queue declared without saying so (a vhost's default queue type) is
	// counted as a classic one: correct, only without the count of crashed
	// handlers. Defaults to QueueClassic.
	QueueType string
	// Retention is how long a processed message id is remembered, and so
	// the longest redelivery a duplicate is recognised after. It must
	// exceed the longest redelivery window: the relay's stale-claim
	// recovery, broker outages, and operator requeues of FAILED events.
	// At least RetentionMin. Defaults to RetentionDefault.
	Retention time.Duration
	// CleanupInterval is how often expired records are deleted on a server
	// without TTL indexes (FerretDB); unused where a TTL index does it.
	// At least one second. Defaults to CleanupIntervalDefault.
	CleanupInterval time.Duration
	// AckBatch is how many settled messages Run acknowledges at once (one
	// multiple-ack). Run also acknowledges whenever no further delivery is
	// waiting, so a prefetch below AckBatch never stalls it.
	// 1 to 10000. Defaults to AckBatchDefault.
	AckBatch int
	// RetryPause is how long Run waits after a database failure (not a
	// handler error) before the next message, so that an outage does not
	// spin. Defaults to RetryPauseDefault.
	RetryPause time.Duration
	// Logger receives the inbox's log lines, each with message_id. Message
	// bodies and headers are never logged. Defaults to slog.Default().
	Logger *slog.Logger
	// Metrics receive what the inbox counts (see Metrics). Defaults to
	// counting nothing but Stats.
	Metrics Metrics
	// TracerProvider starts the CONSUMER span of each message's handler
	// (see Handle). Defaults to otel.GetTracerProvider(), the global one,
	// which starts no recording span until the application sets one.
	TracerProvider trace.TracerProvider
	// Propagator reads a delivery's trace context (and baggage) from its
	// headers. Defaults to otel.GetTextMapPropagator(), the global one,
	// which reads nothing until the application sets one (the W3C
	// propagation.TraceContext{} reads what the relay writes).
	Propagator propagation.TextMapPropagator
	// TraceParent is what a delivery's process span is to its message's
	// creation context: TraceParentAmbient (linked; the span's parent is
	// the caller's span) or TraceParentMessage (its child, linked to the
	// caller's span). Defaults to TraceParentAmbient.
	TraceParent string
	// Queue is the queue the deliveries come from, and Server the
	// broker's host:port: the process span's messaging.destination.name
	// ({exchange}:{routing key}:{queue}) and server.address and
	// server.port. Optional: without them the span says less.
	Queue, Server string
}

func (c *Config) setDefaults() {
	c.Database = cmp.Or(c.Database, DatabaseDefault)
	c.Collection = cmp.Or(c.Collection, CollectionDefault)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, MaxAttemptsDefault)
	c.QueueType = cmp.Or(c.QueueType, QueueClassic)
	c.Retention = cmp.Or(c.Retention, RetentionDefault)
	c.CleanupInterval = cmp.Or(c.CleanupInterval, CleanupIntervalDefault)
	c.AckBatch = cmp.Or(c.AckBatch, AckBatchDefault)
	c.RetryPause = cmp.Or(c.RetryPause, RetryPauseDefault)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Propagator == nil {
		c.Propagator = otel.GetTextMapPropagator()
	}
	c.TraceParent = cmp.Or(c.TraceParent, TraceParentAmbient)
}

// Validate reports the first setting out of range, by name and value.
func (c *Config) Validate() error {
	return rule.First("inbox",
		rule.Between("MaxAttempts", c.MaxAttempts, 1, 1000),
		rule.OneOf("QueueType", c.QueueType, QueueClassic, QueueQuorum),
		rule.OneOf("TraceParent", c.TraceParent, TraceParentAmbient, TraceParentMessage),
		rule.Check("Retention", c.Retention >= RetentionMin, c.Retention,
			fmt.Sprintf("at least %s, and more than the longest redelivery window", RetentionMin)),
		rule.AtLeast("CleanupInterval", c.CleanupInterval, time.Second),
		rule.Between("AckBatch", c.AckBatch, 1, 10000),
		rule.Check("RetryPause", c.RetryPause >= 0, c.RetryPause, "0 or more"),
		rule.Required("Database", c.Database != ""),
		rule.Required("Collection", c.Collection != ""),
	)
}
