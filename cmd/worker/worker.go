package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.mongodb.org/mongo-driver/v2/event"
	driver "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/outboxrelay/outbox/internal/buildinfo"
	"github.com/outboxrelay/outbox/internal/redact"
	"github.com/outboxrelay/outbox/internal/telemetry"
	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/ops"
	"github.com/outboxrelay/outbox/ownership"
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

// worker is the wired relay: the outboxes it relays, each with its own
// services, and what the process shares among them: the logger, the
// database clients (one per cluster), the HTTP server, the metrics
// registry and the tracer provider.
type worker struct {
	cfg      Config
	logger   *slog.Logger
	clients  map[string]*driver.Client // by MongoDB URI
	outboxes []*relayedOutbox
	http     *ops.Server
	tracer   *telemetry.Provider
	reg      *prometheus.Registry
	process  *metrics.Metrics // the process's collectors
	monitor  *event.CommandMonitor
	// streams are the change streams that wake the outboxes: one per
	// database, shared by its outboxes (wake.Streams).
	streams *wake.Streams
	// gate bounds the outboxes that prepare their collections at once.
	gate startGate
	// reload reads the fleet file again, hup delivers SIGHUP and
	// fileChanged a change of the file (watch.go); all nil: no reload
	// (tests that build a worker in process).
	reload      func() ([]outboxConfig, error)
	hup         <-chan os.Signal
	fileChanged <-chan struct{}
	// spec is the fleet file's entries as last loaded, patterns among
	// them; discovery, what was found for the patterns (discover.go).
	spec      []outboxConfig
	discovery *discovery
	// starts are the goroutines that start outboxes; run waits for them
	// before it stops the worker.
	starts sync.WaitGroup
}

// newWorker builds the outboxes of cfg.Outboxes (which loadConfig has
// validated) and what they share: one logger, one metrics registry (each
// outbox's series labelled with its name, the process's without), one
// tracer provider (nil: tracing off), and one database client per
// distinct URI, so that the outboxes of one cluster share its connection
// pool. The worker shuts the tracer provider down last when it stops.
func newWorker(cfg Config, logger *slog.Logger, tracer *telemetry.Provider) (*worker, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	process := metrics.NewProcess(reg)
	if tracer == nil {
		tracer = &telemetry.Provider{TracerProvider: noop.NewTracerProvider()}
	}
	monitor := process.CommandMonitor()
	switch {
	case cfg.TraceMongo && tracer.Enabled():
		monitor = mongo.Monitors(monitor, mongo.CommandTracer(tracer))
	case cfg.TraceMongo:
		logger.Warn("OUTBOX_TRACE_MONGO has no effect while tracing is off (OTEL_TRACES_EXPORTER unset or none)")
	}
	w := &worker{cfg: cfg, logger: logger, clients: map[string]*driver.Client{}, tracer: tracer,
		reg: reg, process: process, monitor: monitor,
		streams: wake.NewStreams(wake.StreamsConfig{Logger: logger}), gate: newStartGate(startsAtOnce),
		spec: cfg.Outboxes, discovery: newDiscovery()}
	fail := func(err error) (*worker, error) {
		_ = w.disconnect(context.Background()) // nothing was connected: Connect only starts the pools
		return nil, err
	}
	// The outboxes of patterns are found once run has started (discover.go).
	initial, _ := expandOutboxes(w.spec, nil)
	var opsOutboxes []ops.Outbox
	for _, oc := range initial {
		o, err := w.newOutbox(oc)
		if err != nil {
			return fail(err)
		}
		w.outboxes = append(w.outboxes, o)
		opsOutboxes = append(opsOutboxes, o.opsOutbox())
	}
	var now func() time.Time // the local clock while no outbox is relayed yet
	if len(w.outboxes) > 0 {
		now = w.outboxes[0].clock.Now
	}
	var err error
	w.http, err = ops.NewServer(ops.ServerConfig{
		Archetype: service.Archetype{Logger: logger, Metrics: process, Tracer: tracer.TracerProvider, Now: now},
		Addr:      cfg.HTTPAddr, WorkerID: cfg.WorkerID, Outboxes: opsOutboxes, Gatherer: reg,
		Token: cfg.HTTPToken, PprofAddr: cfg.PprofAddr,
	})
	if err != nil {
		return fail(err)
	}
	return w, nil
}

// newOutbox builds the services of the outbox oc, with the database
// client of its URI (made now if no outbox has used that URI yet) and
// metrics labelled with its name.
func (w *worker) newOutbox(oc outboxConfig) (*relayedOutbox, error) {
	client, err := w.client(oc.MongoURI)
	if err != nil {
		return nil, w.named(oc.Name, err)
	}
	m := metrics.NewOutbox(outboxRegisterer(w.reg, oc.Name), w.process)
	o, err := newRelayedOutbox(oc, client, w.logger, m, w.tracer, w.streams)
	if err != nil {
		m.Unregister(outboxRegisterer(w.reg, oc.Name))
		return nil, w.named(oc.Name, err)
	}
	o.gate = w.gate
	return o, nil
}

// client is the database client of uri, made now if nothing has used
// that URI yet: one per cluster, whose pool its outboxes (and discovery)
// share. Read and write concerns are the worker's: a fleet file does not
// set them.
func (w *worker) client(uri string) (*driver.Client, error) {
	if client, ok := w.clients[uri]; ok {
		return client, nil
	}
	cfg := w.cfg
	cfg.MongoURI = uri
	client, err := driver.Connect(mongoClientOptions(cfg, connectionName("outbox-worker", w.cfg.WorkerID)).SetMonitor(w.monitor))
	if err != nil {
		return nil, fmt.Errorf("%w: invalid OUTBOX_MONGO_URI %q: %v", ErrUsage, redact.URL(uri), err)
	}
	w.clients[uri] = client
	for _, o := range overriddenURIOptions(uri) {
		w.logger.Warn("the MongoDB URI's option is overridden by a setting", "option", o.option, "setting", o.setting)
	}
	return client, nil
}

// fleet reports whether the worker relays the outboxes of a fleet file,
// whose errors and log lines name the outbox.
func (w *worker) fleet() bool { return w.cfg.FleetFile != "" }

// named prefixes err with the outbox's name in a fleet.
func (w *worker) named(outbox string, err error) error {
	if !w.fleet() {
		return err
	}
	return fmt.Errorf("outbox %s: %w", outbox, err)
}

// disconnect closes every database client.
func (w *worker) disconnect(ctx context.Context) error {
	var errs []error
	for _, c := range w.clients {
		errs = append(errs, c.Disconnect(ctx))
	}
	return errors.Join(errs...)
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
//
// The order of start and stop. The HTTP server starts first and stops
// last, so that an orchestrator sees a live, not-ready worker while a
// database or the broker is still out of reach, and health answers until
// the end. Each outbox then starts on its own (relayedOutbox.start): one
// whose database is down waits for it, with backoff, while the others
// relay. At the stop the outboxes stop side by side, each in its own
// order (newRelayedOutbox), within the one shutdown timeout; then the
// database clients are disconnected, and last the tracer provider exports
// the spans still queued (those of the stop itself among them) and shuts
// down, within what is left of the shutdown timeout and at most
// tracerFlushMax; a failed export is logged and does not fail the stop.
// An outbox that cannot start for good (a collection missing with
// OUTBOX_SETUP=check, a broker URL refused) stops the worker, as it
// would a worker of that outbox alone.
func (w *worker) run(ctx context.Context) error {
	build := buildinfo.Read()
	attrs := []any{"version", build.Version, "revision", build.Revision, "build_date", build.BuildDate,
		"go_version", build.GoVersion, "goos", build.GOOS, "goarch", build.GOARCH, "amqp_url", redactSetting(w.cfg.AMQPURL)}
	if !w.fleet() {
		// A fleet's outboxes each say where they are ("outbox starting").
		attrs = append(attrs, "mongo_uri", redact.URL(w.cfg.MongoURI),
			"exchange", w.cfg.AMQPExchange, "batch_size", w.cfg.BatchSize, "claim_schedule", w.cfg.ClaimSchedule)
	}
	w.logger.Info("worker starting", append(attrs,
		// Derived when not set: the log says what they came to.
		"stale_after", w.cfg.StaleAfter.String(), "publish_timeout", w.cfg.PublishTimeout.String(),
		"tracing", tracingMode(w.cfg, w.tracer), "outboxes", outboxNames(w.cfg.Outboxes))...)
	if err := w.http.Start(ctx); err != nil {
		return w.stop(err, false)
	}
	// Said apart from "worker running": an outbox whose database is down
	// holds that line back, while /readyz and /status already answer.
	w.logger.Info("http server listening", "http_addr", w.http.Addr(), "pprof_addr", w.http.PprofAddr())
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var running sync.WaitGroup
	running.Add(len(w.outboxes))
	for _, o := range w.outboxes {
		w.launch(runCtx, cancel, o, running.Done)
	}
	allRunning := make(chan struct{})
	go func() { running.Wait(); close(allRunning) }()
	defer w.startFleetWatch(runCtx)()
	ticks, stopTicks := w.discoveryTicks()
	defer stopTicks()
	w.rediscover(runCtx) // the databases of the patterns, now rather than in an interval
	for runCtx.Err() == nil {
		select {
		case <-allRunning:
			allRunning = nil
			if runCtx.Err() != nil {
				break // one of them failed, or the worker was stopped
			}
			w.logger.Info("worker running", "http_addr", w.http.Addr(), "pprof_addr", w.http.PprofAddr(),
				"trigger", triggerAccess(w.cfg.HTTPToken))
		case <-w.hup:
			w.reloadOutboxes(runCtx, "SIGHUP")
		case <-w.fileChanged:
			w.reloadOutboxes(runCtx, "file changed")
		case <-ticks:
			w.rediscover(runCtx)
		case <-runCtx.Done():
		}
	}
	w.starts.Wait()
	<-allRunningOrDone(allRunning)
	cause := context.Cause(runCtx)
	if ctx.Err() != nil {
		w.logger.Info("worker stopping", "timeout", w.cfg.ShutdownTimeout.String())
		cause = nil
	}
	return w.stop(cause, true)
}

// allRunningOrDone is c, or a closed channel once run has stopped
// waiting on it (nil): the goroutine that closes c has returned by then
// or returns once every start has, which run waits for first.
func allRunningOrDone(c chan struct{}) <-chan struct{} {
	if c == nil {
		done := make(chan struct{})
		close(done)
		return done
	}
	return c
}

// launch starts o in a goroutine of its own, under a context that a
// reload which removes o cancels; done, if not nil, is called once the
// start has returned. A start that fails stops the worker through fail,
// as a worker of that outbox alone stops, unless a reload removed the
// outbox meanwhile; fail nil (a reload's start) only logs it: an outbox
// added to a running fleet must not stop the relay of the others.
func (w *worker) launch(runCtx context.Context, fail context.CancelCauseFunc, o *relayedOutbox, done func()) {
	if w.fleet() {
		w.logger.Info("outbox starting", o.describe()...)
	}
	octx, cancel := context.WithCancel(runCtx)
	o.cancel = cancel
	w.starts.Go(func() {
		if done != nil {
			defer done()
		}
		err := o.start(octx)
		switch {
		case err != nil && octx.Err() != nil && runCtx.Err() == nil:
			// Removed by a reload before it ran.
		case err != nil && fail == nil:
			o.logger.Error("outbox not started: it relays nothing until the next reload or restart", "error", err)
		case err != nil:
			fail(w.named(o.name, err))
		case w.fleet():
			o.logger.Info("outbox running")
		}
	})
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

// stop shuts the worker down within the shutdown timeout, in the order
// run gives; httpStarted says whether the HTTP server was. A service that
// was not started (the stop came during start-up) is left alone. Each
// error names its service, and its outbox in a worker of several. Once
// the timeout has run out every later service is still told to stop,
// which ends its goroutines at once; those whose error only says that the
// deadline had passed are listed on one line.
func (w *worker) stop(cause error, httpStarted bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.ShutdownTimeout)
	defer cancel()
	errs := []error{cause}
	if errors.Is(cause, context.Canceled) {
		errs = nil // a signal during start-up is a clean stop
	}
	fleet := w.fleet()
	var mu sync.Mutex
	var late []string
	var wg sync.WaitGroup
	for _, o := range w.outboxes {
		wg.Go(func() {
			oErrs, oLate := o.stop(ctx)
			mu.Lock()
			defer mu.Unlock()
			for _, err := range oErrs {
				if fleet {
					err = fmt.Errorf("outbox %s: %w", o.name, err)
				}
				errs = append(errs, err)
			}
			for _, name := range oLate {
				late = append(late, qualify(fleet, o.name, name))
			}
		})
	}
	wg.Wait()
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
	if httpStarted {
		stopPart("http server", w.http.Stop)
	}
	stopPart("database connection", w.disconnect)
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
