package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outboxrelay/outbox/broker"
	"github.com/outboxrelay/outbox/claim"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/memlimit"
	"github.com/outboxrelay/outbox/internal/redact"
	"github.com/outboxrelay/outbox/internal/telemetry"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/ops"
	"github.com/outboxrelay/outbox/recovery"
	"github.com/outboxrelay/outbox/retention"
)

// Config is every setting of the worker. Each comes from a flag, else from
// its environment variable, else from its default; docs/configuration.md
// lists them.
type Config struct {
	MongoURI        string
	MongoDatabase   string
	MongoCollection string
	AMQPURL         string
	AMQPExchange    string
	ClaimSchedule   string
	// ClaimIdleMax is claim.Config's IdleMax (OUTBOX_CLAIM_IDLE_MAX); 0
	// is auto, which loadOutboxes resolves (resolveClaimIdleMax).
	ClaimIdleMax time.Duration
	WakeOnInsert bool
	BatchSize    int
	BatchBytes   int
	// BatchBytesAuto is OUTBOX_BATCH_BYTES=auto: validate derives
	// BatchBytes from MemoryLimit.
	BatchBytesAuto bool
	// MemoryLimit is the memory limit the worker runs under (none when
	// its Bytes are 0).
	MemoryLimit      memlimit.Limit
	RecoverySchedule string
	StaleAfter       time.Duration
	MaxAttempts      int
	RetryMin         time.Duration
	RetryMax         time.Duration
	PublishTimeout   time.Duration
	MaxMessageBytes  int
	Retention        time.Duration
	HTTPAddr         string
	// HTTPToken is the bearer token POST /trigger requires; "" lets only
	// loopback clients trigger.
	HTTPToken string
	// ConsoleConfig is what `worker console` reads (consoleconfig.go).
	ConsoleConfig
	ShutdownTimeout time.Duration
	WorkerID        string
	LogLevel        slog.Level
	LogFormat       string
	// PprofAddr is the loopback address of the profiler; "" is off.
	PprofAddr string
	// Ordering and OrderingAfterFailed are claim.Config's Ordering and
	// AfterFailed.
	Ordering            string
	OrderingAfterFailed string

	// MessageFormat is events.Format's Name; CloudEventsSource its
	// Source, which validate derives from the database and collection
	// when it is unset; CloudEventsPrefix its Prefix.
	MessageFormat     string
	CloudEventsSource string
	CloudEventsPrefix string
	// TraceParent and TraceMessage are claim.Config's (OUTBOX_TRACE_PARENT,
	// OUTBOX_TRACE_MESSAGE).
	TraceParent  string
	TraceMessage string
	// TraceMongo traces the database commands (OUTBOX_TRACE_MONGO) while
	// tracing is on.
	TraceMongo bool
	// Tracing is what the OTEL_* variables say (relay only).
	Tracing telemetry.Config

	// MongoReadConcern, MongoWriteConcern and MongoJournal pin how the
	// worker's client reads and writes, whatever the URI says.
	MongoReadConcern  string
	MongoWriteConcern string
	MongoJournal      bool

	// FleetFile is OUTBOX_FLEET_FILE: the file that lists the outboxes
	// to relay (package fleet); "" relays the one outbox the settings
	// describe.
	FleetFile string
	// Outbox names the outbox of FleetFile an operator command acts on
	// (--outbox, or the file's only one), for its audit records; ""
	// without a file.
	Outbox string
	// DiscoveryInterval is OUTBOX_FLEET_DISCOVERY_INTERVAL: how often the
	// worker lists the databases of the fleet file's patterns
	// (discover.go). Defaults to DiscoveryIntervalDefault.
	DiscoveryInterval time.Duration
	// Outboxes are the outboxes the relay relays, each with its settings
	// (loadOutboxes), or those `worker console` serves (everyOutbox);
	// the other commands act on one, which Config itself describes.
	Outboxes []outboxConfig

	// Setup is OUTBOX_SETUP: what worker run does about a collection or
	// index it needs and does not find (setupAuto, setupCheck).
	Setup string
}

// setting binds one Config field to its flag and environment variable.
type setting struct {
	env, flag, def, usage string
	// parse checks the value, its syntax (a number, a duration, a URI)
	// and its range (the bounds of the package Config fields it sets,
	// which their constants name), and sets it. Config.validate checks
	// the rules between settings: a Config that passes both makes package
	// Configs that their constructors accept.
	parse func(c *Config, v string) error
	// forOperatorCommands: the operator commands (stats, requeue, skip,
	// show) read this setting too; the others only the relay does.
	forOperatorCommands bool
	// forConsole: `worker console` reads this setting besides the
	// operator commands' ones.
	forConsole bool
	// secret: errors never show the value, not even redacted.
	secret bool
}

// commandKind says which settings a command reads: the relay reads every
// setting and checks the rules between them; an operator command reads
// only those that reach the database and shape its output.
type commandKind int

const (
	relayCommand commandKind = iota
	operatorCommand
	// consoleKind reads the operator commands' settings and those
	// forConsole.
	consoleKind
	// setupKind reads the operator commands' settings; without --outbox
	// it selects no outbox of the fleet file: `worker setup` sets up
	// every one.
	setupKind
)

// ErrUsage marks a configuration error: the worker exits with code 2.
var ErrUsage = errors.New("usage")

func settings() []setting {
	return slices.Concat([]setting{
		{env: "OUTBOX_MONGO_URI", flag: "mongo-uri", def: "mongodb://localhost:27017", forOperatorCommands: true,
			usage: "MongoDB connection URI", parse: func(c *Config, v string) error { return parseMongoURI(&c.MongoURI, v) }},
		{env: "OUTBOX_MONGO_DATABASE", flag: "mongo-database", def: mongo.DatabaseDefault, forOperatorCommands: true,
			usage: "database of the outbox collection", parse: func(c *Config, v string) error { return nonEmpty(&c.MongoDatabase, v) }},
		{env: "OUTBOX_MONGO_COLLECTION", flag: "mongo-collection", def: mongo.CollectionDefault, forOperatorCommands: true,
			usage: "outbox collection", parse: func(c *Config, v string) error { return nonEmpty(&c.MongoCollection, v) }},
		{env: "OUTBOX_MONGO_READ_CONCERN", flag: "mongo-read-concern", def: "majority", forOperatorCommands: true,
			usage: "read concern of every read (overrides the URI's readConcernLevel)", parse: func(c *Config, v string) error { return oneOf(&c.MongoReadConcern, v, "majority", "local") }},
		{env: "OUTBOX_MONGO_WRITE_CONCERN", flag: "mongo-write-concern", def: "majority", forOperatorCommands: true,
			usage: "write concern w of every write (overrides the URI's w)", parse: func(c *Config, v string) error { return parseWriteConcern(&c.MongoWriteConcern, v) }},
		{env: "OUTBOX_MONGO_JOURNAL", flag: "mongo-journal", def: "true", forOperatorCommands: true,
			usage: "writes wait for the journal (overrides the URI's journal)", parse: func(c *Config, v string) error { return parseBool(&c.MongoJournal, v) }},
		{env: "OUTBOX_AMQP_URL", flag: "amqp-url", def: "amqp://guest:guest@localhost:5672/",
			usage: "RabbitMQ URL, or a comma-separated list of the nodes' URLs, tried in order", parse: parseAMQPURL},
		{env: "OUTBOX_AMQP_EXCHANGE", flag: "amqp-exchange", def: broker.ExchangeDefault,
			usage: "topic exchange events are published to", parse: func(c *Config, v string) error { return nonEmpty(&c.AMQPExchange, v) }},
		{env: "OUTBOX_CLAIM_SCHEDULE", flag: "claim-schedule", def: claim.ScheduleDefault,
			usage: "cron schedule of claims", parse: func(c *Config, v string) error { return parseSchedule(&c.ClaimSchedule, v) }},
		{env: "OUTBOX_CLAIM_IDLE_MAX", flag: "claim-idle-max", def: "auto",
			usage: "longest gap between claims of an outbox whose claims find nothing: idle claims back off 1, 2, 4 ... ticks apart up to it; auto: " + claim.IdleMaxDefault.String() + " with OUTBOX_FLEET_FILE, no back-off without", parse: parseClaimIdleMax},
		{env: "OUTBOX_WAKE_ON_INSERT", flag: "wake-on-insert", def: "true",
			usage: "claim at once when a NEW event is inserted (a change stream, where the database supports one)", parse: func(c *Config, v string) error { return parseBool(&c.WakeOnInsert, v) }},
		{env: "OUTBOX_BATCH_SIZE", flag: "batch-size", def: strconv.Itoa(claim.BatchSizeDefault),
			usage: "most events one claim takes (1-10000)", parse: func(c *Config, v string) error { return parseIntBetween(&c.BatchSize, v, 1, claim.BatchSizeMax) }},
		{env: "OUTBOX_BATCH_BYTES", flag: "batch-bytes", def: "auto",
			usage: "bound on the raw size of one claim's documents, which the worker's memory grows with (docs/performance.md, Peak RSS); auto: what fits in the memory limit (cgroup or GOMEMLIMIT), at most 64 MiB", parse: parseBatchBytes},
		{env: "OUTBOX_RECOVERY_SCHEDULE", flag: "recovery-schedule", def: recovery.ScheduleDefault,
			usage: "cron schedule of stale-claim recovery", parse: func(c *Config, v string) error { return parseSchedule(&c.RecoverySchedule, v) }},
		// A second at least: the operator commands read it too, and the
		// relay checks it against the publish timeout (Config.validate).
		{env: "OUTBOX_STALE_AFTER", flag: "stale-after", def: recovery.StaleAfterDefault.String(), forOperatorCommands: true,
			usage: "how long an event may stay PROCESSING before recovery takes it back", parse: func(c *Config, v string) error { return parseDurationAtLeast(&c.StaleAfter, v, time.Second) }},
		{env: "OUTBOX_MAX_ATTEMPTS", flag: "max-attempts", def: strconv.Itoa(claim.MaxAttemptsDefault),
			usage: "claims an event gets before it becomes FAILED", parse: func(c *Config, v string) error { return parseIntBetween(&c.MaxAttempts, v, 1, claim.MaxAttemptsMax) }},
		{env: "OUTBOX_RETRY_MIN", flag: "retry-min", def: claim.RetryMinDefault.String(),
			usage: "delay before the first retry of a failed publish", parse: func(c *Config, v string) error { return parseDurationAtLeast(&c.RetryMin, v, claim.DelayMin) }},
		{env: "OUTBOX_RETRY_MAX", flag: "retry-max", def: claim.RetryMaxDefault.String(),
			usage: "cap of the delay between retries", parse: func(c *Config, v string) error { return parseDuration(&c.RetryMax, v) }},
		{env: "OUTBOX_PUBLISH_TIMEOUT", flag: "publish-timeout", def: "auto",
			usage: "wait for one batch's confirms before its unconfirmed events go back to NEW; auto: half of OUTBOX_STALE_AFTER, at most 30s", parse: parsePublishTimeout},
		{env: "OUTBOX_MAX_MESSAGE_BYTES", flag: "max-message-bytes", def: strconv.Itoa(claim.MaxBodyBytesDefault),
			usage: "largest message body; a larger event becomes FAILED", parse: func(c *Config, v string) error {
				return parseIntBetween(&c.MaxMessageBytes, v, 1, claim.MaxBodyBytesMax)
			}},
	}, formatSettings(), []setting{
		{env: "OUTBOX_RETENTION", flag: "retention", def: retention.RetentionDefault.String(),
			usage: "how long PUBLISHED events are kept; 0 keeps them", parse: parseRetention},
		{env: "OUTBOX_HTTP_ADDR", flag: "http-addr", def: ":8080",
			usage: "address of /healthz, /readyz, /metrics, /status and /trigger", parse: func(c *Config, v string) error { return parseAddr(&c.HTTPAddr, v) }},
		{env: "OUTBOX_HTTP_TOKEN", flag: "http-token", def: "", secret: true,
			usage: "bearer token POST /trigger requires (Authorization: Bearer <token>); unset: only clients on this host may trigger. Prefer the variable: a flag shows in ps", parse: parseHTTPToken},
		{env: "OUTBOX_SHUTDOWN_TIMEOUT", flag: "shutdown-timeout", def: "30s",
			usage: "how long a stop may take", parse: func(c *Config, v string) error { return parseDurationAtLeast(&c.ShutdownTimeout, v, time.Second) }},
		{env: "OUTBOX_WORKER_ID", flag: "worker-id", def: defaultWorkerID(),
			usage: "this worker's id on its claims", parse: func(c *Config, v string) error { return nonEmpty(&c.WorkerID, v) }},
		{env: "OUTBOX_LOG_LEVEL", flag: "log-level", def: "info", forOperatorCommands: true,
			usage: "debug, info, warn or error", parse: func(c *Config, v string) error { return c.LogLevel.UnmarshalText([]byte(v)) }},
		{env: "OUTBOX_LOG_FORMAT", flag: "log-format", def: "auto", forOperatorCommands: true,
			usage: "auto (text on a terminal, else json), json or text", parse: func(c *Config, v string) error { return oneOf(&c.LogFormat, v, "auto", "json", "text") }},
		{env: "OUTBOX_ORDERING", flag: "ordering", def: claim.OrderingAggregate, forConsole: true,
			usage: "aggregate: events of one aggregate are published in createdAt order; none: no order", parse: func(c *Config, v string) error {
				return oneOf(&c.Ordering, v, claim.OrderingAggregate, claim.OrderingNone)
			}},
		{env: "OUTBOX_ORDERING_AFTER_FAILED", flag: "ordering-after-failed", def: claim.AfterFailedWait, forOperatorCommands: true,
			usage: "wait: later events of an aggregate wait behind a FAILED one until it is requeued or skipped; continue: they flow", parse: func(c *Config, v string) error {
				return oneOf(&c.OrderingAfterFailed, v, claim.AfterFailedWait, claim.AfterFailedContinue)
			}},
	}, consoleSettings(), traceSettings(), []setting{
		{env: "OUTBOX_FLEET_FILE", flag: "fleet-file", def: "", forOperatorCommands: true,
			usage: "YAML file listing the outboxes to relay, each with its name, database, collection, exchange and the settings it sets apart (docs/configuration.md, Fleet file); unset: the one outbox the other settings describe, named default",
			parse: func(c *Config, v string) error { c.FleetFile = v; return nil }},
		{env: "OUTBOX_FLEET_DISCOVERY_INTERVAL", flag: "fleet-discovery-interval", def: DiscoveryIntervalDefault.String(),
			usage: "how often the databases of the fleet file's patterns (databases:) are listed, so that a database that appears is relayed and one that disappears is let go (at least 1s)",
			parse: func(c *Config, v string) error { return parseDurationAtLeast(&c.DiscoveryInterval, v, time.Second) }},
		{env: "OUTBOX_SETUP", flag: "setup", def: setupAuto,
			usage: "what run does about a collection or index it needs and does not find: auto creates it (as worker setup does); check creates nothing and stops naming what is missing, for a role that may not create indexes (docs/upgrading.md)",
			parse: func(c *Config, v string) error { return oneOf(&c.Setup, v, setupAuto, setupCheck) }},
		{env: "OUTBOX_PPROF_ADDR", flag: "pprof-addr", def: "",
			usage: "loopback address such as 127.0.0.1:6060 on which Go's profiler serves /debug/pprof/; unset: off", parse: parsePprofAddr},
	})
}

// defaultWorkerID is <hostname>-<pid>: unique per process, and it says
// where to look when an operator sees it on a stuck event.
func defaultWorkerID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}

// loadConfig reads the settings a command needs from args, then getenv,
// then defaults. It returns the remaining arguments. Every error wraps
// ErrUsage and names the variable, the flag and the bad value.
func loadConfig(name string, args []string, getenv func(string) string, kind commandKind, extra func(*flag.FlagSet)) (Config, []string, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var chosen []setting
	values := map[string]*string{}
	for _, s := range settings() {
		if ((kind == operatorCommand || kind == setupKind) && !s.forOperatorCommands) || (kind == consoleKind && !s.forOperatorCommands && !s.forConsole) {
			continue
		}
		chosen = append(chosen, s)
		values[s.flag] = fs.String(s.flag, "", fmt.Sprintf("%s (env %s, default %q)", s.usage, s.env, redactSetting(s.def)))
	}
	var outbox string
	if kind != relayCommand {
		fs.StringVar(&outbox, "outbox", "", "`NAME` of the outbox of OUTBOX_FLEET_FILE to act on (needed when the file lists several); without a file, the one outbox is named "+implicitOutbox)
	}
	if extra != nil {
		extra(fs)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return Config{}, nil, &helpRequest{text: commandUsage(name, fs, chosen)}
		}
		if flagName, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -"); ok {
			var names []string
			fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
			return Config{}, nil, fmt.Errorf("%w: %s: unknown flag --%s%s", ErrUsage, name, flagName, didYouMean(flagName, names, "--%s"))
		}
		return Config{}, nil, fmt.Errorf("%w: %s: %v", ErrUsage, name, err)
	}
	if fs.NArg() > 0 {
		// `worker --batch-size 100 stats` must not start the relay.
		return Config{}, nil, fmt.Errorf("%w: %s: unexpected argument %q (commands come first; every setting is a flag)", ErrUsage, name, fs.Arg(0))
	}
	var cfg Config
	sources := map[string]source{}
	for _, s := range chosen {
		src := source{*values[s.flag], "--" + s.flag}
		if src.value == "" {
			src = source{getenv(s.env), s.env}
		}
		if src.value == "" {
			src = source{s.def, "default of " + s.env}
		}
		sources[s.env] = src
		if err := s.parse(&cfg, strings.TrimSpace(src.value)); err != nil {
			return Config{}, nil, invalidSetting(s, src, err.Error())
		}
	}
	switch {
	case kind == consoleKind && outbox == "" && cfg.FleetFile != "":
		// The console serves every outbox of the file.
		outboxes, err := everyOutbox(cfg, chosen)
		if err != nil {
			return Config{}, nil, err
		}
		cfg.Outboxes = outboxes
	case kind == setupKind && outbox == "":
		// Setup sets up every outbox of the file, or the one outbox the
		// settings describe (setup.go).
	case kind != relayCommand:
		if err := selectOutbox(&cfg, outbox, chosen); err != nil {
			return Config{}, nil, err
		}
		if kind == consoleKind {
			// One outbox: named as the file names it, unnamed without
			// a file, so that its console looks as it always did.
			cfg.Outboxes = []outboxConfig{{Name: cfg.Outbox, Config: cfg}}
		}
	}
	if kind == relayCommand {
		cfg.MemoryLimit = readMemoryLimit(getenv)
		raw := cfg
		if err := cfg.validate(); err != nil {
			var bad *settingsError
			if errors.As(err, &bad) {
				i := slices.IndexFunc(chosen, func(s setting) bool { return s.env == bad.env })
				return Config{}, nil, invalidSetting(chosen[i], sources[bad.env], bad.why)
			}
			return Config{}, nil, fmt.Errorf("%w: %v", ErrUsage, err)
		}
		// The OTEL_* variables are OpenTelemetry's, read from the
		// environment only (no flags), and checked before anything
		// connects as the worker's own are.
		tracing, err := telemetry.ConfigFromEnv(getenv)
		if err != nil {
			return Config{}, nil, fmt.Errorf("%w: %v", ErrUsage, err)
		}
		cfg.Tracing = tracing
		// Checked after the worker's own settings, so that a bad variable
		// is named as such rather than as every outbox's.
		raw.Tracing = tracing
		outboxes, err := loadOutboxes(raw)
		if err != nil {
			return Config{}, nil, err
		}
		cfg.Outboxes = outboxes
	}
	return cfg, fs.Args(), nil
}

// source is where a setting's value came from: the value as given, and
// "--flag", the variable, or "default of" the variable.
type source struct{ value, from string }

// invalidSetting is the error of a setting whose value is bad: it names
// the variable, where the value came from when that is not the variable
// itself (a flag, the default), and the value, its passwords hidden, and
// says why.
func invalidSetting(s setting, src source, why string) error {
	name := s.env
	if src.from != s.env {
		name += " (" + src.from + ")"
	}
	value := redactSetting(src.value)
	if s.secret {
		value = "<redacted>"
	}
	return fmt.Errorf("%w: invalid %s %q: %s", ErrUsage, name, value, why)
}

// settingsError is a rule between settings that the value of the setting
// env breaks; why says what it wants.
type settingsError struct{ env, why string }

func (e *settingsError) Error() string { return "invalid " + e.env + ": " + e.why }

// validate derives what was left to be derived and checks the rules
// between settings, which no setting's parse can check alone. Each
// setting's own range was checked as it was parsed, so the package
// Configs newWorker makes of a valid Config are valid: their
// constructors validate them, once.
func (c *Config) validate() error {
	if c.BatchBytesAuto {
		c.BatchBytes = batchBytesFor(c.MemoryLimit.Bytes)
	}
	if c.CloudEventsSource == "" {
		c.CloudEventsSource = events.DefaultCloudEventsSource(c.MongoDatabase, c.MongoCollection)
	}
	derived := c.PublishTimeout == 0
	if derived {
		c.PublishTimeout = derivedPublishTimeout(c.StaleAfter)
	}
	if err := c.checkStaleMargin(derived); err != nil {
		return err
	}
	if c.RetryMax < c.RetryMin {
		return &settingsError{env: "OUTBOX_RETRY_MAX", why: fmt.Sprintf("want at least OUTBOX_RETRY_MIN (%s)", c.RetryMin)}
	}
	return nil
}

// checkStaleMargin checks that the stale threshold leaves a batch the time
// it may take: up to the publish timeout plus the writes after it. A stale
// threshold below that would take batches back from healthy workers and
// turn slow publishes into duplicates.
func (c *Config) checkStaleMargin(derived bool) error {
	margin := staleMargin(c.PublishTimeout)
	if c.StaleAfter > c.PublishTimeout+margin {
		return nil
	}
	if derived {
		return fmt.Errorf("invalid OUTBOX_STALE_AFTER %s: too short to leave a batch time to publish (OUTBOX_PUBLISH_TIMEOUT auto: %s) and write its outcome (%s); set OUTBOX_STALE_AFTER to %s or more",
			c.StaleAfter, c.PublishTimeout, margin, minStaleAfter)
	}
	return fmt.Errorf("invalid OUTBOX_STALE_AFTER %s: must exceed OUTBOX_PUBLISH_TIMEOUT (%s) by more than %s, or healthy batches are taken back; raise OUTBOX_STALE_AFTER above %s, or lower OUTBOX_PUBLISH_TIMEOUT (unset, it is derived: %s)",
		c.StaleAfter, c.PublishTimeout, margin, c.PublishTimeout+margin, derivedPublishTimeout(c.StaleAfter))
}

// minStaleAfter is the least OUTBOX_STALE_AFTER that works with the
// publish timeout derived from it: 4s plus a bit, rounded to a second.
const minStaleAfter = 5 * time.Second

// derivedPublishTimeout is OUTBOX_PUBLISH_TIMEOUT's auto value: half of
// the stale threshold, so that the other half is left for claiming and for
// writing the outcome, and at most claim.PublishTimeoutDefault, so that
// the default stale threshold keeps the default timeout.
func derivedPublishTimeout(staleAfter time.Duration) time.Duration {
	return min(claim.PublishTimeoutDefault, staleAfter/2)
}

// staleMargin is what the stale threshold must leave beyond the publish
// timeout for the writes around a publish (the claim, the PUBLISHED marks,
// the release of what is unconfirmed): a third of the publish timeout,
// since a batch that may publish for long is large and so are its writes,
// but at least 2s, a few database round trips under load, and at most
// 10s, the margin a 30s timeout has always had.
func staleMargin(publishTimeout time.Duration) time.Duration {
	return min(max(publishTimeout/3, 2*time.Second), 10*time.Second)
}

func parseBatchBytes(c *Config, v string) error {
	c.BatchBytesAuto = v == "auto"
	if c.BatchBytesAuto {
		return nil // derived by validate
	}
	if _, err := strconv.Atoi(v); err != nil {
		return errors.New("want auto or a whole number of bytes")
	}
	return parseIntBetween(&c.BatchBytes, v, 1, claim.BatchBytesMax)
}

func parsePublishTimeout(c *Config, v string) error {
	if v == "auto" {
		c.PublishTimeout = 0 // derived by validate
		return nil
	}
	if err := parseDurationAtLeast(&c.PublishTimeout, v, claim.DelayMin); err != nil {
		return fmt.Errorf("want auto or a duration such as 5s (at least %s)", claim.DelayMin)
	}
	return nil
}

func parseRetention(c *Config, v string) error {
	if err := parseDuration(&c.Retention, v); err != nil {
		return err
	}
	if c.Retention < 0 {
		return errors.New("want 0 (keep forever) or more")
	}
	return nil
}

func parseAMQPURL(c *Config, v string) error {
	if err := broker.CheckURLs(v); err != nil {
		return err
	}
	c.AMQPURL = v
	return nil
}

// parseHTTPToken accepts no token (only loopback clients may trigger) or
// one that ops.Server takes.
func parseHTTPToken(c *Config, v string) error {
	if v != "" {
		if err := ops.CheckToken(v); err != nil {
			return err
		}
	}
	c.HTTPToken = v
	return nil
}

// parsePprofAddr accepts no address (no profiler) or a loopback one: the
// profiler shows the process's memory, and a profile costs CPU.
func parsePprofAddr(c *Config, v string) error {
	if v != "" {
		if err := ops.CheckLoopbackAddr(v); err != nil {
			return err
		}
	}
	c.PprofAddr = v
	return nil
}

// redactSetting hides the passwords in a setting's value, which may be a
// URL, a comma-separated list of AMQP URLs, or no URL at all.
func redactSetting(v string) string {
	urls := broker.SplitURLs(v)
	for i, u := range urls {
		urls[i] = redact.Value(u)
	}
	return strings.Join(urls, ",")
}
