package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	driver "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/outboxrelay/outbox/broker"
	"github.com/outboxrelay/outbox/claim"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/backoff"
	"github.com/outboxrelay/outbox/internal/buildinfo"
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

// startStopper is anything the worker starts and stops.
type startStopper interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// part is one of the worker's services, named for the errors of a stop:
// "worker stopped with errors" says which part failed, or which ran out
// of time, not only that a deadline passed.
type part struct {
	name string
	startStopper
}

// worker is the wired relay.
type worker struct {
	cfg       Config
	logger    *slog.Logger
	client    *driver.Client
	store     *mongo.Store
	publisher *broker.Publisher
	claimer   *claim.Claimer
	clock     *mongo.Clock // the database server's time
	owner     *ownership.Manager
	sampler   *ops.Sampler // samples the backlog gauges while this replica leads, or while none does
	waker     *wake.Watcher
	http      *ops.Server
	tracer    *telemetry.Provider
	// outer are started first, before the database is ready, and stopped
	// last, in reverse; inner are started once it is ready, and stopped
	// first, in the same order. newWorker says why.
	outer, inner []part
	// started are the names of the services Start was called on: a stop
	// during start-up stops those and no others, so that it neither waits
	// on a database that never answered nor fails on what never ran.
	started map[string]bool
}

// newWorker builds the services, each package's Config once and whole,
// from cfg (which loadConfig has validated) and from what the worker
// wires in: one logger, one set of metrics, one tracer provider (nil:
// tracing off) and the database server's clock, shared by every service
// (service.Archetype). The worker shuts the tracer provider down last
// when it stops.
func newWorker(cfg Config, logger *slog.Logger, tracer *telemetry.Provider) (*worker, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(reg)
	if tracer == nil {
		tracer = &telemetry.Provider{TracerProvider: noop.NewTracerProvider()}
	}

	monitor := m.CommandMonitor()
	switch {
	case cfg.TraceMongo && tracer.Enabled():
		monitor = mongo.Monitors(monitor, mongo.CommandTracer(tracer))
	case cfg.TraceMongo:
		logger.Warn("OUTBOX_TRACE_MONGO has no effect while tracing is off (OTEL_TRACES_EXPORTER unset or none)")
	}
	client, err := driver.Connect(mongoClientOptions(cfg, connectionName("outbox-worker", cfg.WorkerID)).SetMonitor(monitor))
	if err != nil {
		return nil, fmt.Errorf("%w: invalid OUTBOX_MONGO_URI %q: %v", ErrUsage, redact.URL(cfg.MongoURI), err)
	}
	w := &worker{cfg: cfg, logger: logger, client: client, tracer: tracer}
	storeCfg := mongoStoreConfig(cfg, logger)
	storeCfg.SequenceAnomaly = func(kind string, n int) { m.SequenceAnomalies.WithLabelValues(kind).Add(float64(n)) }
	w.store = mongo.New(client, storeCfg)
	// Every age the worker reports, recovery's stale test, retention's
	// cutoff, leases and terms read the database server's clock: the
	// times they compare with were written against it (or by producers),
	// not against this machine's clock.
	w.clock = mongo.NewClock(client, logger)
	// The provider itself, not its wrapper: a claimer that is given a
	// no-op provider starts no span at all (see claim.newTracing).
	arch := service.Archetype{Logger: logger, Metrics: m, Tracer: tracer.TracerProvider, Now: w.clock.Now}
	for _, o := range overriddenURIOptions(cfg.MongoURI) {
		logger.Warn("the MongoDB URI's option is overridden by a setting", "option", o.option, "setting", o.setting)
	}
	w.publisher, err = broker.New(broker.Config{
		// The confirm window holds a whole batch.
		URL: cfg.AMQPURL, Exchange: cfg.AMQPExchange, Window: max(broker.WindowDefault, cfg.BatchSize),
		// A broker that stops reading fails a write within the publish timeout.
		WriteTimeout:   cfg.PublishTimeout,
		ConnectionName: connectionName("outbox-worker", cfg.WorkerID),
		Logger:         logger,
		OnConnected:    func(up bool) { m.BrokerConnected.Set(map[bool]float64{true: 1}[up]) },
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	// Partitions are owned for terms of half the stale threshold, so that
	// a dead replica's partitions are free before its claims go stale:
	// its share is taken over within OUTBOX_STALE_AFTER plus a recovery
	// period. Terms and leases are timed by the database server's clock.
	w.owner, err = ownership.New(w.store.Owners(), ownership.Config{
		Archetype: arch, WorkerID: cfg.WorkerID, TermLength: cfg.StaleAfter / 2, Synced: w.clock.Synced, Ready: w.publisher.Ready,
		OnLead: func() { w.sampler.Trigger() },
		OnTake: func() { w.claimer.Trigger() },
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	w.claimer, err = claim.New(w.store, w.publisher, claim.Config{
		Archetype: arch, Owner: w.owner, RoundTrip: w.clock.RoundTrip,
		WorkerID: cfg.WorkerID, Schedule: cfg.ClaimSchedule, BatchSize: cfg.BatchSize, BatchBytes: cfg.BatchBytes,
		MaxAttempts: cfg.MaxAttempts, MaxBodyBytes: cfg.MaxMessageBytes, PublishTimeout: cfg.PublishTimeout,
		RetryMin: cfg.RetryMin, RetryMax: cfg.RetryMax, StaleAfter: cfg.StaleAfter,
		Ordering: cfg.Ordering, AfterFailed: cfg.OrderingAfterFailed,
		Format:      events.Format{Name: cfg.MessageFormat, Source: cfg.CloudEventsSource, Prefix: cfg.CloudEventsPrefix},
		TraceParent: cfg.TraceParent, TraceMessage: cfg.TraceMessage,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	w.waker, err = wake.New(wake.Config{
		Collection: w.store.Collection(),
		Trigger:    w.claimer.Trigger,
		Logger:     logger,
	})
	if err != nil {
		return nil, err
	}
	// Periodic work that can wait yields to the relay while the database
	// is slowing claims down.
	recoverer, err := recovery.New(w.store, recovery.Config{
		Archetype: arch, Yield: w.claimer.Slow,
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
	w.clock.OnJump(func(jump time.Duration) {
		w.owner.ClockJumped(jump)
		recoverer.ClockJumped(jump)
	})
	cleaner, err := retention.New(w.store, retention.Config{Archetype: arch, Yield: w.claimer.Slow, Retention: cfg.Retention})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	failedHolds := cfg.Ordering == claim.OrderingAggregate && cfg.OrderingAfterFailed == claim.AfterFailedWait
	var held ops.HeldSource
	if cfg.Ordering == claim.OrderingAggregate {
		held = w.store
	}
	// The leader samples the backlog gauges for all replicas. While no
	// replica has led for longer than a term (none can write the owners
	// collection, or none can publish), every replica samples: the gauges
	// are never missing while a worker runs that can read the outbox, and
	// the load of a sample per replica lasts only as long as the fault.
	w.sampler, err = ops.NewSampler(ops.SamplerConfig{
		Archetype: arch, Yield: w.claimer.Slow,
		Store: w.store, StaleAfter: cfg.StaleAfter, Held: held, FailedHolds: failedHolds, Paused: w.store,
		Active: func() bool { return w.owner.Leads() || w.owner.Leaderless() },
	})
	if err != nil {
		return nil, err
	}
	wakeUp := func() string { return "off" }
	if cfg.WakeOnInsert {
		wakeUp = w.waker.Mode
	}
	w.http, err = ops.NewServer(ops.ServerConfig{
		Archetype: arch,
		Addr:      cfg.HTTPAddr, WorkerID: cfg.WorkerID, Store: w.store, Broker: w.publisher, Samples: w.sampler,
		Claimer: w.claimer, Recovery: recoverer, Owner: w.owner, Gatherer: reg,
		Token: cfg.HTTPToken, PprofAddr: cfg.PprofAddr,
		BrokerNode: w.publisher.Node, WakeUp: wakeUp,
	})
	if err != nil {
		return nil, err
	}
	// The order of start and stop. The outer services start first, before
	// the database is ready, and stop last, in reverse: the HTTP server,
	// so that an orchestrator sees a live, not-ready worker while the
	// database or the broker is still out of reach, and health answers
	// until the end; then the broker connection, which nothing uses once
	// the inner services have stopped. The inner services start once the
	// database is ready, and stop first, in the same order: the claimer,
	// so that claiming stops and the batch in flight finishes (its
	// confirms awaited, its outcomes written, what is unconfirmed released
	// to NEW); then the ownership, which gives back the partitions now
	// that no claim runs; then the wake-up (if on), recovery, retention,
	// the sampler and the clock. The database client is disconnected
	// after them, and last the tracer provider exports the spans still
	// queued (those of the stop itself among them) and shuts down, within
	// what is left of the shutdown timeout and at most tracerFlushMax; a
	// failed export is logged and does not fail the stop.
	w.outer = []part{{"http server", w.http}, {"broker connection", w.publisher}}
	w.inner = []part{{"claimer", w.claimer}, {"ownership", ownerService{w.owner}}}
	if cfg.WakeOnInsert {
		w.inner = append(w.inner, part{"wake-up", w.waker})
	}
	w.inner = append(w.inner, part{"recovery", recoverer}, part{"retention", cleaner},
		part{"sampler", w.sampler}, part{"clock", w.clock})
	return w, nil
}

// tracerFlushMax bounds the export of the spans still queued at stop,
// within the shutdown timeout: a collector answers a batch in
// milliseconds, and one that is down must not hold a stop for the SDK's
// export timeout (OTEL_BSP_EXPORT_TIMEOUT, 30 s by default).
const tracerFlushMax = 5 * time.Second

// ownerService stops the partition ownership after the claimer and gives
// the partitions back, so that the other replicas take this one's share
// at once rather than after its terms run out.
type ownerService struct{ m *ownership.Manager }

func (o ownerService) Start(ctx context.Context) error { return o.m.Start(ctx) }

func (o ownerService) Stop(ctx context.Context) error {
	if err := o.m.Stop(ctx); err != nil {
		return err
	}
	return o.m.Release(ctx)
}

// mongoClientOptions is the client of the worker and of its operator
// commands. Read preference, read concern and write concern are set on the
// client, after the URI, so that they override whatever the URI says: the
// claim must read what a failover cannot roll back, from the primary, and
// every write must be on a majority (and its journal) before the worker
// acts on it, or a PUBLISHED mark could be rolled back and the event
// published again. The settings can weaken them; the URI cannot.
func mongoClientOptions(cfg Config, appName string) *options.ClientOptions {
	return options.Client().
		ApplyURI(cfg.MongoURI).
		SetAppName(appName).
		SetReadPreference(readpref.Primary()).
		SetReadConcern(cfg.mongoReadConcern()).
		SetWriteConcern(cfg.mongoWriteConcern())
}

// mongoStoreConfig is the store's configuration, its transactions pinned
// as the client is.
func mongoStoreConfig(cfg Config, logger *slog.Logger) mongo.Config {
	return mongo.Config{
		Database: cfg.MongoDatabase, Collection: cfg.MongoCollection, Logger: logger,
		ReadConcern: cfg.mongoReadConcern(), WriteConcern: cfg.mongoWriteConcern(),
	}
}

// uriOverride is a URI option that a setting overrides.
type uriOverride struct{ option, setting string }

// overriddenURIOptions lists the options of uri that the worker's settings
// override, so that an operator who wrote them hears that they do nothing.
func overriddenURIOptions(uri string) []uriOverride {
	u, err := url.Parse(uri)
	if err != nil {
		return nil
	}
	settingOf := map[string]string{
		"readpreference":   "read preference primary (fixed)",
		"readconcernlevel": "OUTBOX_MONGO_READ_CONCERN",
		"w":                "OUTBOX_MONGO_WRITE_CONCERN",
		"journal":          "OUTBOX_MONGO_JOURNAL",
	}
	var out []uriOverride
	for k := range u.Query() {
		if s, ok := settingOf[strings.ToLower(k)]; ok {
			out = append(out, uriOverride{option: k, setting: s})
		}
	}
	slices.SortFunc(out, func(a, b uriOverride) int { return strings.Compare(a.option, b.option) })
	return out
}

// run starts the worker, waits for ctx to end (a signal), and stops it.
func (w *worker) run(ctx context.Context) error {
	build := buildinfo.Read()
	w.logger.Info("worker starting",
		"version", build.Version, "revision", build.Revision, "build_date", build.BuildDate,
		"go_version", build.GoVersion, "goos", build.GOOS, "goarch", build.GOARCH,
		"mongo_uri", redact.URL(w.cfg.MongoURI), "amqp_url", redactSetting(w.cfg.AMQPURL),
		"exchange", w.cfg.AMQPExchange, "batch_size", w.cfg.BatchSize, "claim_schedule", w.cfg.ClaimSchedule,
		// Derived when not set: the log says what they came to.
		"stale_after", w.cfg.StaleAfter.String(), "publish_timeout", w.cfg.PublishTimeout.String(),
		"tracing", tracingMode(w.cfg, w.tracer))
	w.started = map[string]bool{}
	if err := w.start(ctx, w.outer); err != nil {
		return w.stop(err)
	}
	if err := w.prepareStore(ctx); err != nil {
		return w.stop(err)
	}
	if err := w.start(ctx, w.inner); err != nil {
		return w.stop(err)
	}
	w.logger.Info("worker running", "http_addr", w.http.Addr(), "pprof_addr", w.http.PprofAddr(),
		"trigger", triggerAccess(w.cfg.HTTPToken))
	<-ctx.Done()
	w.logger.Info("worker stopping", "timeout", w.cfg.ShutdownTimeout.String())
	return w.stop(nil)
}

// tracingMode says how the worker traces, for the start's log line.
func tracingMode(cfg Config, tracer *telemetry.Provider) string {
	if !tracer.Enabled() {
		return "off"
	}
	mode := "otlp " + cfg.Tracing.Protocol + ", publish spans " + cfg.TraceParent + ", messages carry the " + cfg.TraceMessage + "'s context"
	if cfg.TraceMongo {
		mode += ", database commands"
	}
	return mode
}

// triggerAccess says who may POST /trigger, for the start's log line.
func triggerAccess(token string) string {
	if token == "" {
		return "loopback clients only (OUTBOX_HTTP_TOKEN unset)"
	}
	return "clients with OUTBOX_HTTP_TOKEN"
}

// start starts services in order, and returns the error of the first
// that fails to start.
func (w *worker) start(ctx context.Context, parts []part) error {
	for _, p := range parts {
		w.started[p.name] = true
		if err := p.Start(ctx); err != nil {
			return err
		}
	}
	return nil
}

// prepareStore waits for the database with backoff: a worker started
// before its database comes up rather than crash-looping. The server's
// clock is measured meanwhile: the two need nothing of each other, and
// through a slow link their round trips in a row were seconds of start-up.
func (w *worker) prepareStore(ctx context.Context) error {
	syncCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var syncErr error
	synced := make(chan struct{})
	go func() { syncErr = w.clock.Sync(syncCtx); close(synced) }()
	retry := backoff.Backoff{Min: 500 * time.Millisecond, Max: 30 * time.Second}
	for {
		attemptCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := w.prepareSchema(attemptCtx)
		cancel()
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
		w.logger.Warn("mongodb not ready; retrying", "error", err, "retry_in", wait.String())
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
		err = w.clock.Sync(againCtx)
		cancel()
	}
	if err != nil && ctx.Err() == nil {
		// The clock tries again every few seconds once started; until it
		// succeeds ages read this machine's clock and no partition is
		// taken (ownership.Config.Synced), so nothing is claimed.
		w.logger.Warn("database clock not measured; no partition is taken until it is", "error", err)
	}
	if w.store.SupportsTransactions() {
		w.logger.Info("mongodb supports transactions: PUBLISHED writes run in a transaction")
	} else {
		w.logger.Warn("mongodb does not support transactions (standalone server or FerretDB): PUBLISHED writes use the fenced single write")
	}
	return nil
}

// stop shuts the worker down within the shutdown timeout, in the order
// newWorker gives: the inner services as listed, the outer ones in
// reverse, last the database client. A service that was not started
// (the stop came during start-up) is left alone. Each error names its
// service. Once the timeout has run out every later service is still
// told to stop, which ends its goroutines at once; those whose error only
// says that the deadline had passed are listed on one line.
func (w *worker) stop(cause error) error {
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.ShutdownTimeout)
	defer cancel()
	errs := []error{cause}
	if errors.Is(cause, context.Canceled) {
		errs = nil // a signal during start-up is a clean stop
	}
	steps := slices.Clone(w.inner)
	for _, p := range slices.Backward(w.outer) {
		steps = append(steps, p)
	}
	var late []string
	stopPart := func(name string, stop func(context.Context) error) {
		expired := ctx.Err() != nil
		switch err := stop(ctx); {
		case err == nil:
		case expired && errors.Is(err, context.DeadlineExceeded):
			late = append(late, name)
		default:
			errs = append(errs, fmt.Errorf("stop %s: %w", name, err))
		}
	}
	for _, p := range steps {
		if w.started[p.name] {
			stopPart(p.name, p.Stop)
		}
	}
	stopPart("database connection", w.client.Disconnect)
	if late != nil {
		errs = append(errs, fmt.Errorf("the shutdown timeout (%s) had run out before these could stop: %s",
			w.cfg.ShutdownTimeout, strings.Join(late, ", ")))
	}
	flushCtx, cancelFlush := context.WithTimeout(ctx, tracerFlushMax)
	if err := w.tracer.Shutdown(flushCtx); err != nil {
		w.logger.Warn("tracing: spans not exported at stop", "error", err)
	}
	cancelFlush()
	err := errors.Join(errs...)
	if err != nil {
		w.logger.Error("worker stopped with errors", "error", err)
		return err
	}
	w.logger.Info("worker stopped")
	return nil
}
