package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/claim"
	"github.com/outboxrelay/outbox/console"
	"github.com/outboxrelay/outbox/internal/backoff"
	"github.com/outboxrelay/outbox/internal/redact"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/ops"
	"github.com/outboxrelay/outbox/service"
)

// consoleOutboxes are the outboxes `worker console` serves, with the
// clients and clocks they read through: one client and one clock per
// MongoDB URI (a cluster), shared by the outboxes on it. Each outbox
// waits for its database in the background (consoleOpener), so that the
// console starts with the outboxes that are reachable and a database
// that is down makes its own outboxes unavailable, not the console.
type consoleOutboxes struct {
	list     []console.Outbox
	clusters map[string]*consoleCluster
	openers  []*consoleOpener
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

// consoleCluster is the client and clock of one MongoDB URI.
type consoleCluster struct {
	client *driver.Client
	clock  *mongo.Clock
}

func newConsoleOutboxes() *consoleOutboxes {
	return &consoleOutboxes{clusters: map[string]*consoleCluster{}, cancel: func() {}}
}

// add adds oc, read through the client of its URI (made on first use)
// and a sampler of its own, and unavailable until its opener has found
// its database. It does no I/O: a driver connects lazily.
func (s *consoleOutboxes) add(oc outboxConfig, logger *slog.Logger) error {
	cl, err := s.cluster(oc.Config, logger)
	if err != nil {
		return err
	}
	olog := logger
	if oc.Name != "" {
		olog = logger.With("outbox", oc.Name)
	}
	cfg := oc.Config
	store := mongo.New(cl.client, mongoStoreConfig(cfg, olog))
	sampler, err := ops.NewSampler(ops.SamplerConfig{
		Archetype: service.Archetype{Logger: olog, Now: cl.clock.Now}, Store: store, StaleAfter: cfg.StaleAfter,
		Held: heldSource(cfg, store), FailedHolds: cfg.OrderingAfterFailed == claim.AfterFailedWait, Paused: store,
		Failures: store, Holders: store,
	})
	if err != nil {
		return err
	}
	op := newConsoleOpener(olog, store, sampler, cl.clock)
	s.openers = append(s.openers, op)
	s.list = append(s.list, console.Outbox{
		Name: oc.Name, Store: store, Samples: sampler, Lists: sampler, Owners: store.Owners(), Writer: store,
		TermLength: cfg.StaleAfter / 2, FailedHolds: cfg.Ordering == claim.OrderingAggregate && cfg.OrderingAfterFailed == claim.AfterFailedWait,
		Now: cl.clock.Now, Ready: op.ready,
	})
	return nil
}

// cluster is the client and clock of cfg's MongoDB URI, made on first
// use.
func (s *consoleOutboxes) cluster(cfg Config, logger *slog.Logger) (*consoleCluster, error) {
	if cl, ok := s.clusters[cfg.MongoURI]; ok {
		return cl, nil
	}
	client, err := driver.Connect(mongoClientOptions(cfg, "outbox-console"))
	if err != nil {
		return nil, fmt.Errorf("%w: invalid OUTBOX_MONGO_URI %q: %v", ErrUsage, redact.URL(cfg.MongoURI), err)
	}
	cl := &consoleCluster{client: client, clock: mongo.NewClock(client, logger.With("mongo_uri", redact.URL(cfg.MongoURI)))}
	s.clusters[cfg.MongoURI] = cl
	return cl, nil
}

// start starts the clocks, which measure their servers' time until
// they can, and each outbox's opener.
func (s *consoleOutboxes) start(ctx context.Context) {
	ctx, s.cancel = context.WithCancel(ctx)
	for _, cl := range s.clusters {
		_ = cl.clock.Start(ctx) // never fails: it retries until it measures
	}
	for _, op := range s.openers {
		s.wg.Go(func() { op.run(ctx) })
	}
}

// close stops the openers first, so that none starts a sampler after
// it was stopped, then the samplers and clocks (Stop is safe before
// Start), and disconnects the clients.
func (s *consoleOutboxes) close() {
	s.cancel()
	s.wg.Wait()
	for _, op := range s.openers {
		stopQuietly(op.sampler)
	}
	for _, cl := range s.clusters {
		stopQuietly(cl.clock)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = cl.client.Disconnect(ctx)
		cancel()
	}
}

// consoleOpener makes one outbox available once its database answers:
// it learns what the deployment supports, retrying with backoff, then
// creates the console's indexes and starts the outbox's sampler. Until
// then, ready says why the outbox cannot be served.
type consoleOpener struct {
	logger  *slog.Logger
	store   *mongo.Store
	sampler *ops.Sampler
	clock   *mongo.Clock
	// waiting is why the outbox is not available yet; nil once it is.
	waiting atomic.Pointer[error]
}

// errNotAnswered is why an outbox is unavailable before the first try
// of its database has ended.
var errNotAnswered = errors.New("its database has not answered yet")

func newConsoleOpener(logger *slog.Logger, store *mongo.Store, sampler *ops.Sampler, clock *mongo.Clock) *consoleOpener {
	op := &consoleOpener{logger: logger, store: store, sampler: sampler, clock: clock}
	op.waiting.Store(&errNotAnswered)
	return op
}

// ready is console.Outbox.Ready: nil once the outbox is available.
func (op *consoleOpener) ready() error {
	if err := op.waiting.Load(); err != nil {
		return *err
	}
	return nil
}

// run waits for the database, prepares the outbox and makes it
// available; it returns early when ctx ends.
func (op *consoleOpener) run(ctx context.Context) {
	if err := op.waitForDatabase(ctx); err != nil {
		return
	}
	// Ages are by the server's time from the first page on; the clock
	// keeps measuring by itself when this fails.
	if err := op.clock.Sync(ctx); err != nil {
		op.logger.Warn("database clock not measured; ages use this machine's clock until it is", "error", err)
	}
	if err := op.store.EnsureBrowseIndex(ctx); err != nil {
		op.logger.Warn("could not create the console's index; event lists read more of the outbox without it", "error", err)
	}
	_ = op.sampler.Start(ctx) // never fails: it samples on its schedule
	op.waiting.Store(nil)
	op.logger.Info("console outbox available")
}

// waitForDatabase learns what the deployment supports, retrying with
// backoff until it answers: a console started before its database, or
// while it is down, serves its outbox once it is up, without a restart.
func (op *consoleOpener) waitForDatabase(ctx context.Context) error {
	retry := backoff.Backoff{Min: 500 * time.Millisecond, Max: 30 * time.Second}
	for {
		attemptCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := op.store.Detect(attemptCtx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		unreachable := fmt.Errorf("its database is unreachable (%v)", err)
		op.waiting.Store(&unreachable)
		wait := retry.Next()
		op.logger.Warn("mongodb not ready; the console serves this outbox once it answers", "error", err, "retry_in", wait.String())
		if !backoff.Sleep(ctx, wait) {
			return ctx.Err()
		}
	}
}

// heldSource is the store where ordering holds aggregates, nil where it
// does not.
func heldSource(cfg Config, store *mongo.Store) ops.HeldSource {
	if cfg.Ordering != claim.OrderingAggregate {
		return nil
	}
	return store
}
