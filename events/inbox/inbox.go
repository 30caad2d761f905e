package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.opentelemetry.io/otel/trace"
)

// Handler processes one message. With transactions, ctx carries the
// transaction's session: every write made with it commits or rolls back with
// the inbox record, and only then is the message acknowledged. The handler
// may run more than once for one delivery (the driver retries a transaction
// on transient errors), so it does nothing there but database work through
// ctx. It must not acknowledge the delivery itself.
//
// A returned error (or a panic) rolls back and counts as a failed attempt.
//
// ctx carries the inbox's CONSUMER span for the message, linked to the
// trace context its headers carry (read with Config.Propagator), when
// Config.TracerProvider records it; otherwise ctx carries that trace
// context itself (OpenTelemetry's remote span context), unless the
// caller's ctx has a span of its own. See process in trace.go.
type Handler func(ctx context.Context, d amqp.Delivery) error

// ErrNotStarted is returned by Handle and Run before Start has succeeded.
var ErrNotStarted = errors.New("inbox: not started (call Start first)")

// HeaderDeliveryCount is the header a quorum queue sets on a redelivered
// message: how many times it was delivered before. The inbox reads it only
// from a quorum queue (Config.QueueType): elsewhere the publisher wrote it.
const HeaderDeliveryCount = "x-delivery-count"

// sourceFirstDelivery is the attempts_from of a quorum queue's first
// delivery of a message: its first attempt, from the redelivered flag.
const sourceFirstDelivery = "first delivery"

// Document fields.
const (
	fieldID          = "_id"
	fieldProcessedAt = "processedAt"
	fieldAttempts    = "attempts"
	fieldUpdatedAt   = "updatedAt"
)

// Inbox records the ids of processed messages so that each message's
// handler commits once. Create it with New, prepare it with Start, then
// feed it deliveries with Run or Handle.
type Inbox struct {
	cfg      Config
	client   *mongo.Client
	records  *mongo.Collection
	attempts *mongo.Collection
	handler  Handler
	metrics  Metrics
	logger   *slog.Logger
	tracer   trace.Tracer
	now      func() time.Time
	stats    struct{ processed, duplicates, handlerErrors, rejected atomic.Int64 }

	mu          sync.Mutex
	started     bool
	txn         bool
	ttl         bool
	stopCleanup context.CancelFunc
	cleanupDone chan struct{}
}

// New returns an Inbox that runs handler for each new message, recording
// ids in cfg.Database on client. It applies the defaults and validates
// cfg; it does no I/O.
func New(client *mongo.Client, handler Handler, cfg Config) (*Inbox, error) {
	if client == nil || handler == nil {
		return nil, errors.New("inbox: New needs a client and a handler")
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	db := client.Database(cfg.Database)
	return &Inbox{
		cfg:      cfg,
		client:   client,
		records:  db.Collection(cfg.Collection),
		attempts: db.Collection(cfg.Collection + AttemptsSuffix),
		handler:  handler,
		metrics:  cfg.Metrics.withDefaults(),
		logger:   cfg.Logger,
		tracer:   cfg.TracerProvider.Tracer(TracerName),
		now:      time.Now,
	}, nil
}

// Stats are the inbox's totals since New, as Metrics count them.
type Stats struct {
	Processed     int64 // handler committed and id recorded
	Duplicates    int64 // acknowledged without running the handler
	HandlerErrors int64 // failed (or panicked) handler runs
	Rejected      int64 // rejected with requeue=false
}

// Stats returns the totals since New, for programs that report them
// without scraping Prometheus.
func (i *Inbox) Stats() Stats {
	return Stats{
		Processed:     i.stats.processed.Load(),
		Duplicates:    i.stats.duplicates.Load(),
		HandlerErrors: i.stats.handlerErrors.Load(),
		Rejected:      i.stats.rejected.Load(),
	}
}

// Transactional reports whether the handler's writes and the inbox record
// commit in one transaction. It is known once Start has run.
func (i *Inbox) Transactional() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.txn
}

// ExpiresByTTL reports whether a TTL index expires the records (true) or
// the inbox's own cleanup job does (false). It is known once Start has run.
func (i *Inbox) ExpiresByTTL() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.ttl
}

// Start asks the server whether it has transactions, creates the expiry
// indexes (or, without TTL indexes, starts the cleanup job) and logs which
// guarantee holds. It is idempotent.
func (i *Inbox) Start(ctx context.Context) error {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.started {
		return nil
	}
	txn, err := supportsTransactions(ctx, i.client)
	if err != nil {
		return fmt.Errorf("inbox: %w", err)
	}
	ttl, err := i.ensureExpiry(ctx)
	if err != nil {
		return err
	}
	i.txn, i.ttl, i.started = txn, ttl, true
	if txn {
		i.logger.Info("inbox: transactions available: handler writes and the inbox record commit together",
			"collection", i.cfg.Collection)
	} else {
		// Said once, loudly: the guarantee is weaker and the handler must
		// make up for it.
		i.logger.Warn("inbox: transactions unavailable (standalone server or FerretDB): "+
			"the message id is recorded with a unique insert after the handler succeeds; "+
			"a crash in between runs the handler again, so the handler must be idempotent",
			"collection", i.cfg.Collection)
	}
	if !ttl {
		i.logger.Info("inbox: no TTL indexes on this server: a cleanup job deletes expired records",
			"retention", i.cfg.Retention.String(), "cleanup_interval", i.cfg.CleanupInterval.String())
		cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		i.stopCleanup, i.cleanupDone = cancel, make(chan struct{})
		go i.cleanupLoop(cctx, i.cleanupDone)
	}
	return nil
}

// Stop stops the cleanup job and waits for it, or returns ctx.Err() when
// ctx ends first. It is idempotent and safe before Start. It does not stop
// Run: cancel Run's context first, so that it acknowledges what it has
// committed, then call Stop.
func (i *Inbox) Stop(ctx context.Context) error {
	i.mu.Lock()
	cancel, done := i.stopCleanup, i.cleanupDone
	i.stopCleanup = nil
	i.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// outcome is how a processed delivery is settled.
type outcome int

const (
	outcomeAck     outcome = iota // processed now or before
	outcomeRequeue                // try again later
	outcomeReject                 // never again: dead-letter or drop
)

// handlerError marks an error as the handler's, not the database's.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }

// errDuplicate aborts a transaction whose insert found the id recorded.
var errDuplicate = errors.New("message id already recorded")

// Handle processes one delivery and settles it: acknowledged when its
// handler committed now or before, requeued after a failed attempt below
// MaxAttempts, rejected (requeue=false) after the last one or when it has
// no message_id. It returns an error when the database failed (the message
// is requeued without counting an attempt) or when settling failed; a
// handler error is logged and counted, not returned.
func (i *Inbox) Handle(ctx context.Context, d amqp.Delivery) error {
	out, err := i.process(ctx, d)
	if serr := settle(d, out); serr != nil {
		return errors.Join(err, fmt.Errorf("inbox: settle message: %w", serr))
	}
	return err
}

func settle(d amqp.Delivery, out outcome) error {
	switch out {
	case outcomeAck:
		return d.Ack(false)
	case outcomeRequeue:
		return d.Nack(false, true)
	default:
		return d.Reject(false)
	}
}

// processMessage runs the handler unless the message id is recorded, and
// says how to settle the delivery, and what error the handler returned if
// it failed. A non-nil err is a database failure or an ended ctx; the
// outcome is then a requeue.
func (i *Inbox) processMessage(ctx context.Context, d amqp.Delivery) (_ outcome, handlerErr, err error) {
	i.mu.Lock()
	started, txn := i.started, i.txn
	i.mu.Unlock()
	if !started {
		return outcomeRequeue, nil, ErrNotStarted
	}
	id := d.MessageId
	if id == "" {
		i.metrics.Rejected(ReasonNoMessageID)
		i.stats.rejected.Add(1)
		i.logger.Error("inbox: message rejected: no message_id to deduplicate on",
			"message_id", id, "routing_key", d.RoutingKey, "reason", ReasonNoMessageID)
		return outcomeReject, nil, nil
	}
	start := i.now()
	var dup bool
	if txn {
		dup, err = i.processInTransaction(ctx, d)
	} else {
		dup, err = i.processWithoutTransaction(ctx, d)
	}
	switch {
	case dup:
		i.metrics.Duplicate()
		i.stats.duplicates.Add(1)
		i.logger.Debug("inbox: duplicate skipped", "message_id", id, "redelivered", d.Redelivered)
		return outcomeAck, nil, nil
	case err == nil:
		i.metrics.Handled(i.now().Sub(start))
		i.metrics.Processed()
		i.stats.processed.Add(1)
		if d.Redelivered {
			i.forgetAttempts(ctx, id)
		}
		return outcomeAck, nil, nil
	case ctx.Err() != nil:
		// Shutting down is not the message's fault: no attempt counted.
		return outcomeRequeue, nil, fmt.Errorf("inbox: message %s: %w", id, ctx.Err())
	}
	var herr *handlerError
	if !errors.As(err, &herr) {
		i.logger.Warn("inbox: database failed; message requeued", "message_id", id, "error", err)
		return outcomeRequeue, nil, fmt.Errorf("inbox: message %s: %w", id, err)
	}
	i.metrics.Handled(i.now().Sub(start))
	i.metrics.HandlerError()
	i.stats.handlerErrors.Add(1)
	n, source, cerr := i.countAttempt(ctx, d)
	if cerr != nil {
		i.logger.Warn("inbox: handler failed and its attempt could not be counted; message requeued",
			"message_id", id, "error", herr.err, "count_error", cerr)
		return outcomeRequeue, herr.err, fmt.Errorf("inbox: message %s: count attempt: %w", id, cerr)
	}
	if n >= i.cfg.MaxAttempts {
		i.metrics.Rejected(ReasonMaxAttempts)
		i.stats.rejected.Add(1)
		i.logger.Error("inbox: message rejected after its last attempt (dead-lettered if the queue has a dead-letter exchange)",
			"message_id", id, "attempts", n, "max_attempts", i.cfg.MaxAttempts, "attempts_from", source,
			"reason", ReasonMaxAttempts, "error", herr.err)
		// A message shovelled back from the dead-letter queue starts afresh.
		i.forgetAttempts(ctx, id)
		return outcomeReject, herr.err, nil
	}
	i.logger.Warn("inbox: handler failed; rolled back and requeued",
		"message_id", id, "attempts", n, "max_attempts", i.cfg.MaxAttempts, "attempts_from", source, "error", herr.err)
	return outcomeRequeue, herr.err, nil
}

// record is one processed message id.
type record struct {
	ID          string    `bson:"_id"`
	ProcessedAt time.Time `bson:"processedAt"`
}

// processInTransaction inserts the record first, so that a duplicate is
// found (duplicate key) before the handler runs, then runs the handler in
// the same transaction and commits: one insert and one commit beyond the
// handler's writes.
func (i *Inbox) processInTransaction(ctx context.Context, d amqp.Delivery) (dup bool, err error) {
	sess, err := i.client.StartSession()
	if err != nil {
		return false, fmt.Errorf("start session: %w", err)
	}
	defer sess.EndSession(ctx)
	_, err = sess.WithTransaction(ctx, func(sc context.Context) (any, error) {
		if _, err := i.records.InsertOne(sc, record{ID: d.MessageId, ProcessedAt: i.now().UTC()}); err != nil {
			if mongo.IsDuplicateKeyError(err) {
				return nil, errDuplicate
			}
			return nil, fmt.Errorf("record message id: %w", err)
		}
		return nil, i.runHandler(sc, d)
	})
	if errors.Is(err, errDuplicate) {
		return true, nil
	}
	return false, err
}

// processWithoutTransaction looks the id up, runs the handler, then
// inserts the record. Inserting after the handler means no failure loses
// a message: a crash or a failed insert after the handler succeeded runs
// it again on redelivery, which the idempotent handler absorbs. (Inserting
// first would keep two concurrent copies from both running, but a crash
// during the handler would then leave a record for work never done, and
// the redelivery would be skipped: a lost message.)
func (i *Inbox) processWithoutTransaction(ctx context.Context, d amqp.Delivery) (dup bool, err error) {
	err = i.records.FindOne(ctx, bson.D{{Key: fieldID, Value: d.MessageId}}).Err()
	switch {
	case err == nil:
		return true, nil
	case !errors.Is(err, mongo.ErrNoDocuments):
		return false, fmt.Errorf("look up message id: %w", err)
	}
	if err := i.runHandler(ctx, d); err != nil {
		return false, err
	}
	_, err = i.records.InsertOne(ctx, record{ID: d.MessageId, ProcessedAt: i.now().UTC()})
	if mongo.IsDuplicateKeyError(err) {
		// Another copy, processed concurrently, recorded it first: the
		// handler ran twice, as the weaker guarantee allows.
		i.logger.Info("inbox: message recorded concurrently by another copy; handler ran twice", "message_id", d.MessageId)
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("record message id after the handler succeeded (it will run again): %w", err)
	}
	return false, nil
}

// runHandler runs the handler, turning its error or panic into a
// handlerError: a panicking message is retried and rejected like a failing
// one rather than crashing the consumer over and over.
func (i *Inbox) runHandler(ctx context.Context, d amqp.Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &handlerError{fmt.Errorf("handler panicked: %v", r)}
		}
	}()
	if err := i.handler(ctx, d); err != nil {
		return &handlerError{err}
	}
	return nil
}

// countAttempt returns how many attempts the message has now used, and
// where the count comes from. A quorum queue counts deliveries itself
// (x-delivery-count); otherwise the count is a document in the attempts
// collection, written outside the rolled-back transaction so it survives.
//
// The header is read only where the broker writes it: on a quorum queue
// (Config.QueueType), and only on a redelivery. On a classic queue the
// header can only be the publisher's, and a forged one would dead-letter a
// message at its first failure (99) or let a poison message loop for ever
// (0). Even a quorum queue writes its count only on a redelivery: measured
// on RabbitMQ 3.10, a consumer's first delivery of a message carries the
// publisher's header untouched (a forged 99 arrives as 99), and every
// redelivery the broker's count. So a first delivery (not redelivered) is
// the first attempt whatever the header says.
func (i *Inbox) countAttempt(ctx context.Context, d amqp.Delivery) (n int, source string, err error) {
	if i.cfg.QueueType == QueueQuorum {
		if !d.Redelivered {
			return 1, sourceFirstDelivery, nil
		}
		if prior, ok := deliveryCount(d.Headers); ok {
			return prior + 1, HeaderDeliveryCount, nil
		}
	}
	var doc struct {
		Attempts int `bson:"attempts"`
	}
	err = i.attempts.FindOneAndUpdate(ctx,
		bson.D{{Key: fieldID, Value: d.MessageId}},
		bson.D{
			{Key: "$inc", Value: bson.D{{Key: fieldAttempts, Value: 1}}},
			{Key: "$set", Value: bson.D{{Key: fieldUpdatedAt, Value: i.now().UTC()}}},
		},
		optionsUpsertAfter(),
	).Decode(&doc)
	if err != nil {
		return 0, "", err
	}
	return doc.Attempts, i.attempts.Name(), nil
}

// forgetAttempts deletes a message's attempts document, if any. Failing is
// harmless (retention deletes it later), so it is only logged.
func (i *Inbox) forgetAttempts(ctx context.Context, id string) {
	if _, err := i.attempts.DeleteOne(ctx, bson.D{{Key: fieldID, Value: id}}); err != nil && ctx.Err() == nil {
		i.logger.Debug("inbox: delete attempts document", "message_id", id, "error", err)
	}
}

// deliveryCount reads x-delivery-count, which amqp091-go decodes as one of
// several integer types.
func deliveryCount(h amqp.Table) (int, bool) {
	switch v := h[HeaderDeliveryCount].(type) {
	case int64:
		return int(v), v >= 0
	case int32:
		return int(v), v >= 0
	case int16:
		return int(v), v >= 0
	case int8:
		return int(v), v >= 0
	case int:
		return v, v >= 0
	case uint8:
		return int(v), true
	case uint16:
		return int(v), true
	case uint32:
		return int(v), true
	}
	return 0, false
}

func optionsUpsertAfter() options.Lister[options.FindOneAndUpdateOptions] {
	return options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)
}

// supportsTransactions asks the server what it is: transactions need a
// replica set member (setName) or a mongos router (msg "isdbgrid"). A
// standalone server, and FerretDB, report neither. The relay asks the
// same in its own module; this module cannot import the relay's
// packages, and the question is a few lines.
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
