package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/broker"
	"github.com/outboxrelay/outbox/claim"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/backoff"
	"github.com/outboxrelay/outbox/internal/redact"
	"github.com/outboxrelay/outbox/internal/telemetry"
	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/ops"
	"github.com/outboxrelay/outbox/ownership"
	"github.com/outboxrelay/outbox/recovery"
	"github.com/outboxrelay/outbox/retention"
	"github.com/outboxrelay/outbox/service"
	"github.com/outboxrelay/outbox/wake"
)

// relayedOutbox is one outbox and every service that relays it: nothing
// of one outbox's state (partitions, claims, fences, pauses, samples) is
// shared with another's, so that each keeps every promise of a worker
// that relays it alone.
type relayedOutbox struct {
	name      string
	cfg       Config
	oc        outboxConfig     // as loaded, for a reload to compare
	metrics   *metrics.Metrics // its own, unregistered when it is removed
	cancel    context.CancelFunc
	logger    *slog.Logger // with the outbox's name
	store     *mongo.Store
	publisher *broker.Publisher
	claimer   *claim.Claimer
	clock     *mongo.Clock // the database server's time
	owner     *ownership.Manager
	sampler   *ops.Sampler // samples the backlog gauges while this replica leads, or while none does
	recoverer *recovery.Recoverer
	waker     *wake.Watcher
	// outer are started first, before the database is ready, and stopped
	// last; inner are started once it is ready, and stopped first, in
	// the same order. newRelayedOutbox says why.
	outer, inner []part
	// started are the names of the services Start was called on: a stop
	// during start-up stops those and no others, so that it neither waits
	// on a database that never answered nor fails on what never ran.
	started map[string]bool
	// startMu is held while the outbox starts, so that a stop waits for
	// the start to have returned before it reads started.
	startMu sync.Mutex
	// gate bounds the outboxes that prepare their collections at once
	// (the worker's; nil: unbounded).
	gate startGate
}

// newRelayedOutbox builds the services of one outbox, each package's
// Config once and whole, from oc (which loadConfig has validated), its
// database client (shared by the outboxes of its cluster), its metrics
// (labelled with its name), the worker's tracer and its change streams
// (one per database, which the outboxes of a database share).
func newRelayedOutbox(oc outboxConfig, client *driver.Client, logger *slog.Logger, m *metrics.Metrics, tracer *telemetry.Provider, streams *wake.Streams) (*relayedOutbox, error) {
	cfg := oc.Config
	o := &relayedOutbox{name: oc.Name, cfg: cfg, oc: oc, metrics: m, cancel: func() {}, logger: logger.With("outbox", oc.Name)}
	storeCfg := mongoStoreConfig(cfg, o.logger)
	storeCfg.SequenceAnomaly = func(kind string, n int) { m.SequenceAnomalies.WithLabelValues(kind).Add(float64(n)) }
	o.store = mongo.New(client, storeCfg)
	// Every age the worker reports, recovery's stale test, retention's
	// cutoff, leases and terms read the database server's clock: the
	// times they compare with were written against it (or by producers),
	// not against this machine's clock.
	o.clock = mongo.NewClock(client, o.logger)
	// The provider itself, not its wrapper: a claimer that is given a
	// no-op provider starts no span at all (see claim.newTracing).
	arch := service.Archetype{Logger: o.logger, Metrics: m, Tracer: tracer.TracerProvider, Now: o.clock.Now}
	var err error
	o.publisher, err = broker.New(broker.Config{
		// The confirm window holds a whole batch.
		URL: cfg.AMQPURL, Exchange: cfg.AMQPExchange, Window: max(broker.WindowDefault, cfg.BatchSize),
		// A broker that stops reading fails a write within the publish timeout.
		WriteTimeout:   cfg.PublishTimeout,
		ConnectionName: connectionName("outbox-worker", brokerConnectionID(cfg.WorkerID, oc.Name)),
		Logger:         o.logger,
		OnConnected:    func(up bool) { m.BrokerConnected.Set(map[bool]float64{true: 1}[up]) },
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	// Partitions are owned for terms of half the stale threshold, so that
	// a dead replica's partitions are free before its claims go stale:
	// its share is taken over within OUTBOX_STALE_AFTER plus a recovery
	// period. Terms and leases are timed by the database server's clock.
	o.owner, err = ownership.New(o.store.Owners(), ownership.Config{
		Archetype: arch, WorkerID: cfg.WorkerID, TermLength: cfg.StaleAfter / 2, Synced: o.clock.Synced, Ready: o.publisher.Ready,
		OnLead: func() { o.sampler.Trigger() },
		OnTake: func() { o.claimer.Trigger() },
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	o.claimer, err = claim.New(o.store, o.publisher, claim.Config{
		Archetype: arch, Owner: o.owner, RoundTrip: o.clock.RoundTrip,
		WorkerID: cfg.WorkerID, Schedule: cfg.ClaimSchedule, IdleMax: cfg.ClaimIdleMax, BatchSize: cfg.BatchSize, BatchBytes: cfg.BatchBytes,
		MaxAttempts: cfg.MaxAttempts, MaxBodyBytes: cfg.MaxMessageBytes, PublishTimeout: cfg.PublishTimeout,
		RetryMin: cfg.RetryMin, RetryMax: cfg.RetryMax, StaleAfter: cfg.StaleAfter,
		Ordering: cfg.Ordering, AfterFailed: cfg.OrderingAfterFailed,
		Format:      events.Format{Name: cfg.MessageFormat, Source: cfg.CloudEventsSource, Prefix: cfg.CloudEventsPrefix},
		TraceParent: cfg.TraceParent, TraceMessage: cfg.TraceMessage,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	o.waker, err = wake.New(wake.Config{Collection: o.store.Collection(), Trigger: o.claimer.Trigger, Logger: o.logger, Streams: streams})
	if err != nil {
		return nil, err
	}
	// Periodic work that can wait yields to the relay while the database
	// is slowing claims down.
	o.recoverer, err = recovery.New(o.store, recovery.Config{
		Archetype: arch, Yield: o.claimer.Slow, OnReset: o.claimer.Trigger,
		Schedule: cfg.RecoverySchedule, StaleAfter: cfg.StaleAfter, MaxAttempts: cfg.MaxAttempts,
		Margin: cfg.StaleAfter / 2 / ownership.MarginDivisorDefault,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	// A jump of the database clock's offset larger than the margin (a
	// failover to a node whose clock differs) stops the claims in every
	// partition for a term, and recovery for the stale threshold, before
	// the new server time is used.
	o.clock.OnJump(func(jump time.Duration) {
		o.owner.ClockJumped(jump)
		o.recoverer.ClockJumped(jump)
	})
	cleaner, err := retention.New(o.store, retention.Config{Archetype: arch, Yield: o.claimer.Slow, IdleSince: o.claimer.IdleSince, Retention: cfg.Retention})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	failedHolds := cfg.Ordering == claim.OrderingAggregate && cfg.OrderingAfterFailed == claim.AfterFailedWait
	var held ops.HeldSource
	if cfg.Ordering == claim.OrderingAggregate {
		held = o.store
	}
	// The leader samples the backlog gauges for all replicas. While no
	// replica has led for longer than a term (none can write the owners
	// collection, or none can publish), every replica samples: the gauges
	// are never missing while a worker runs that can read the outbox, and
	// the load of a sample per replica lasts only as long as the fault.
	o.sampler, err = ops.NewSampler(ops.SamplerConfig{
		Archetype: arch, Yield: o.claimer.Slow, IdleSince: o.claimer.IdleSince,
		Store: o.store, StaleAfter: cfg.StaleAfter, Held: held, FailedHolds: failedHolds, Paused: o.store,
		Active: func() bool { return o.owner.Leads() || o.owner.Leaderless() },
	})
	if err != nil {
		return nil, err
	}
	// The order of start and stop. The broker connection starts first,
	// before the database is ready, so that an orchestrator sees a live,
	// not-ready worker while the database or the broker is still out of
	// reach, and stops last: nothing uses it once the inner services have
	// stopped. The inner services start once the database is ready, and
	// stop first, in the same order: the claimer, so that claiming stops
	// and the batch in flight finishes (its confirms awaited, its
	// outcomes written, what is unconfirmed released to NEW); then the
	// ownership, which gives back the partitions now that no claim runs;
	// then the wake-up (if on), recovery, retention, the sampler and the
	// clock.
	o.outer = []part{{"broker connection", o.publisher}}
	o.inner = []part{{"claimer", o.claimer}, {"ownership", ownerService{o.owner}}}
	if cfg.WakeOnInsert {
		o.inner = append(o.inner, part{"wake-up", o.waker})
	}
	o.inner = append(o.inner, part{"recovery", o.recoverer}, part{"retention", cleaner},
		part{"sampler", o.sampler}, part{"clock", o.clock})
	return o, nil
}

// brokerConnectionID names the replica and, in a fleet, the outbox on
// its broker connection, so that the broker's list of connections tells
// each outbox's apart; the implicit outbox's is named as before.
func brokerConnectionID(workerID, outbox string) string {
	if outbox == implicitOutbox {
		return workerID
	}
	return workerID + "/" + outbox
}

// outboxRegisterer is the registerer of an outbox's metrics: reg, every
// series labelled with the outbox's name.
func outboxRegisterer(reg prometheus.Registerer, name string) prometheus.Registerer {
	return prometheus.WrapRegistererWith(prometheus.Labels{"outbox": name}, reg)
}

// opsOutbox is what the HTTP endpoints report on of the outbox.
func (o *relayedOutbox) opsOutbox() ops.Outbox {
	wakeUp := func() string { return "off" }
	if o.cfg.WakeOnInsert {
		wakeUp = o.waker.Mode
	}
	return ops.Outbox{
		Name: o.name, Store: o.store, Broker: o.publisher, Samples: o.sampler,
		Claimer: o.claimer, Recovery: o.recoverer, Owner: o.owner,
		BrokerNode: o.publisher.Node, WakeUp: wakeUp, Now: o.clock.Now,
	}
}

// start starts the broker connection, waits for the database, and starts
// the services that relay; it returns once they run, or with the error
// that stopped it (ctx's when ctx ended first).
func (o *relayedOutbox) start(ctx context.Context) error {
	o.startMu.Lock()
	defer o.startMu.Unlock()
	o.started = map[string]bool{}
	if err := o.startParts(ctx, o.outer); err != nil {
		return err
	}
	if err := o.prepareStore(ctx); err != nil {
		return err
	}
	return o.startParts(ctx, o.inner)
}

func (o *relayedOutbox) startParts(ctx context.Context, parts []part) error {
	for _, p := range parts {
		o.started[p.name] = true
		if err := p.Start(ctx); err != nil {
			return err
		}
	}
	return nil
}

// stop stops what start started, in the order newRelayedOutbox gives, and
// returns each failure named, and the names of the services that could
// not stop before ctx's deadline.
func (o *relayedOutbox) stop(ctx context.Context) (errs []error, late []string) {
	o.startMu.Lock()
	defer o.startMu.Unlock()
	steps := slices.Clone(o.inner)
	for _, p := range slices.Backward(o.outer) {
		steps = append(steps, p)
	}
	for _, p := range steps {
		if !o.started[p.name] {
			continue
		}
		expired := ctx.Err() != nil
		switch err := p.Stop(ctx); {
		case err == nil:
		case expired && errors.Is(err, context.DeadlineExceeded):
			late = append(late, p.name)
		default:
			errs = append(errs, fmt.Errorf("stop %s: %w", p.name, err))
		}
	}
	return errs, late
}

// prepareStore waits for the database with backoff: a worker started
// before its database comes up rather than crash-looping. The server's
// clock is measured meanwhile: the two need nothing of each other, and
// through a slow link their round trips in a row were seconds of start-up.
func (o *relayedOutbox) prepareStore(ctx context.Context) error {
	syncCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var syncErr error
	synced := make(chan struct{})
	go func() { syncErr = o.clock.Sync(syncCtx); close(synced) }()
	retry := backoff.Backoff{Min: 500 * time.Millisecond, Max: 30 * time.Second}
	for {
		// The attempt's time starts in its slot (see startGate).
		err := o.gate.attempt(ctx, func(ctx context.Context) error {
			attemptCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			return o.prepareSchema(attemptCtx)
		})
		if err == nil {
			break
		}
		var missing *mongo.MissingError
		if errors.As(err, &missing) {
			<-synced
			return err // waiting would not create them
		}
		if ctx.Err() != nil {
			<-synced
			return ctx.Err()
		}
		wait := retry.Next()
		o.logger.Warn("mongodb not ready; retrying", "error", err, "retry_in", wait.String())
		if !backoff.Sleep(ctx, wait) {
			<-synced
			return ctx.Err()
		}
	}
	<-synced
	err := syncErr
	if err != nil && ctx.Err() == nil {
		// Measured while the database was not up yet: again, now it is.
		againCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = o.clock.Sync(againCtx)
		cancel()
	}
	if err != nil && ctx.Err() == nil {
		// The clock tries again every few seconds once started; until it
		// succeeds ages read this machine's clock and no partition is
		// taken (ownership.Config.Synced), so nothing is claimed.
		o.logger.Warn("database clock not measured; no partition is taken until it is", "error", err)
	}
	if o.store.SupportsTransactions() {
		o.logger.Info("mongodb supports transactions: PUBLISHED writes run in a transaction")
	} else {
		o.logger.Warn("mongodb does not support transactions (standalone server or FerretDB): PUBLISHED writes use the fenced single write")
	}
	return nil
}

// describe is the outbox's settings for the start's log line.
func (o *relayedOutbox) describe() []any {
	return []any{"outbox", o.name, "mongo_uri", redact.URL(o.cfg.MongoURI), "database", o.cfg.MongoDatabase, "collection", o.cfg.MongoCollection,
		"exchange", o.cfg.AMQPExchange, "batch_size", o.cfg.BatchSize, "claim_schedule", o.cfg.ClaimSchedule,
		"ordering", o.cfg.Ordering}
}

// qualify prefixes a service's name with its outbox's in a worker of
// several, so that a stop's errors say whose service failed.
func qualify(fleet bool, outbox, name string) string {
	if !fleet {
		return name
	}
	return strings.Join([]string{"outbox", outbox, name}, " ")
}
