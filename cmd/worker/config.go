package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/outboxrelay/outbox/broker"
	"github.com/outboxrelay/outbox/claim"
	"github.com/outboxrelay/outbox/internal/memlimit"
	"github.com/outboxrelay/outbox/internal/redact"
	"github.com/outboxrelay/outbox/internal/rule"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/recovery"
	"github.com/outboxrelay/outbox/retention"
	"github.com/outboxrelay/outbox/schedule"
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
	WakeOnInsert    bool
	BatchSize       int
	BatchBytes      int
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
	ShutdownTimeout  time.Duration
	WorkerID         string
	LogLevel         slog.Level
	LogFormat        string
	Pprof            bool
	// Ordering and OrderingAfterFailed are claim.Config's Ordering and
	// AfterFailed.
	Ordering            string
	OrderingAfterFailed string

	// MongoReadConcern, MongoWriteConcern and MongoJournal pin how the
	// worker's client reads and writes, whatever the URI says.
	MongoReadConcern  string
	MongoWriteConcern string
	MongoJournal      bool
}

// setting binds one Config field to its flag and environment variable.
type setting struct {
	env, flag, def, usage string
	// parse checks the value's syntax (a number, a duration, a URI) and
	// sets it; the ranges are the rules of the package Configs it sets,
	// which Validate checks.
	parse func(c *Config, v string) error
	// fields are the package Config fields the setting sets, such as
	// "claim.BatchSize": an error of their package's Validate names the
	// setting instead.
	fields []string
	// forOperatorCommands: the operator commands (stats, requeue, skip,
	// show) read this setting too; the others only the relay does.
	forOperatorCommands bool
}

// commandKind says which settings a command reads: the relay reads every
// setting and checks the rules between them; an operator command reads
// only those that reach the database and shape its output.
type commandKind int

const (
	relayCommand commandKind = iota
	operatorCommand
)

// ErrUsage marks a configuration error: the worker exits with code 2.
var ErrUsage = errors.New("usage")

func settings() []setting {
	return []setting{
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
		{env: "OUTBOX_AMQP_URL", flag: "amqp-url", def: "amqp://guest:guest@localhost:5672/", fields: []string{"broker.URL"},
			usage: "RabbitMQ URL, or a comma-separated list of the nodes' URLs, tried in order", parse: func(c *Config, v string) error { c.AMQPURL = v; return nil }},
		{env: "OUTBOX_AMQP_EXCHANGE", flag: "amqp-exchange", def: broker.ExchangeDefault,
			usage: "topic exchange events are published to", parse: func(c *Config, v string) error { return nonEmpty(&c.AMQPExchange, v) }},
		{env: "OUTBOX_CLAIM_SCHEDULE", flag: "claim-schedule", def: claim.ScheduleDefault, fields: []string{"claim.Schedule"},
			usage: "cron schedule of claims", parse: func(c *Config, v string) error { return parseSchedule(&c.ClaimSchedule, v) }},
		{env: "OUTBOX_WAKE_ON_INSERT", flag: "wake-on-insert", def: "true",
			usage: "claim at once when a NEW event is inserted (a change stream, where the database supports one)", parse: func(c *Config, v string) error { return parseBool(&c.WakeOnInsert, v) }},
		{env: "OUTBOX_BATCH_SIZE", flag: "batch-size", def: strconv.Itoa(claim.BatchSizeDefault), fields: []string{"claim.BatchSize"},
			usage: "most events one claim takes (1-10000)", parse: func(c *Config, v string) error { return parseInt(&c.BatchSize, v) }},
		{env: "OUTBOX_BATCH_BYTES", flag: "batch-bytes", def: "auto", fields: []string{"claim.BatchBytes"},
			usage: "bound on the raw size of one claim's documents, which the worker's memory grows with (docs/performance.md, Peak RSS); auto: what fits in the memory limit (cgroup or GOMEMLIMIT), at most 64 MiB", parse: parseBatchBytes},
		{env: "OUTBOX_RECOVERY_SCHEDULE", flag: "recovery-schedule", def: recovery.ScheduleDefault, fields: []string{"recovery.Schedule"},
			usage: "cron schedule of stale-claim recovery", parse: func(c *Config, v string) error { return parseSchedule(&c.RecoverySchedule, v) }},
		// The operator commands read OUTBOX_STALE_AFTER too, and they
		// validate no package Config: its least value is checked here.
		{env: "OUTBOX_STALE_AFTER", flag: "stale-after", def: recovery.StaleAfterDefault.String(), forOperatorCommands: true,
			fields: []string{"claim.StaleAfter", "recovery.StaleAfter"},
			usage:  "how long an event may stay PROCESSING before recovery takes it back", parse: func(c *Config, v string) error { return parseDurationAtLeast(&c.StaleAfter, v, time.Second) }},
		{env: "OUTBOX_MAX_ATTEMPTS", flag: "max-attempts", def: strconv.Itoa(claim.MaxAttemptsDefault), fields: []string{"claim.MaxAttempts", "recovery.MaxAttempts"},
			usage: "claims an event gets before it becomes FAILED", parse: func(c *Config, v string) error { return parseInt(&c.MaxAttempts, v) }},
		{env: "OUTBOX_RETRY_MIN", flag: "retry-min", def: claim.RetryMinDefault.String(), fields: []string{"claim.RetryMin"},
			usage: "delay before the first retry of a failed publish", parse: func(c *Config, v string) error { return parseDuration(&c.RetryMin, v) }},
		{env: "OUTBOX_RETRY_MAX", flag: "retry-max", def: claim.RetryMaxDefault.String(), fields: []string{"claim.RetryMax"},
			usage: "cap of the delay between retries", parse: func(c *Config, v string) error { return parseDuration(&c.RetryMax, v) }},
		{env: "OUTBOX_PUBLISH_TIMEOUT", flag: "publish-timeout", def: "auto", fields: []string{"claim.PublishTimeout", "broker.WriteTimeout"},
			usage: "wait for one batch's confirms before its unconfirmed events go back to NEW; auto: half of OUTBOX_STALE_AFTER, at most 30s", parse: parsePublishTimeout},
		{env: "OUTBOX_MAX_MESSAGE_BYTES", flag: "max-message-bytes", def: strconv.Itoa(claim.MaxBodyBytesDefault), fields: []string{"claim.MaxBodyBytes"},
			usage: "largest message body; a larger event becomes FAILED", parse: func(c *Config, v string) error { return parseInt(&c.MaxMessageBytes, v) }},
		{env: "OUTBOX_RETENTION", flag: "retention", def: retention.RetentionDefault.String(), fields: []string{"retention.Retention"},
			usage: "how long PUBLISHED events are kept; 0 keeps them", parse: func(c *Config, v string) error { return parseDuration(&c.Retention, v) }},
		{env: "OUTBOX_HTTP_ADDR", flag: "http-addr", def: ":8080",
			usage: "address of /healthz, /readyz, /metrics, /status and /trigger", parse: func(c *Config, v string) error { return parseAddr(&c.HTTPAddr, v) }},
		{env: "OUTBOX_SHUTDOWN_TIMEOUT", flag: "shutdown-timeout", def: "30s",
			usage: "how long a stop may take", parse: func(c *Config, v string) error { return parseDurationAtLeast(&c.ShutdownTimeout, v, time.Second) }},
		{env: "OUTBOX_WORKER_ID", flag: "worker-id", def: defaultWorkerID(), fields: []string{"claim.WorkerID"},
			usage: "this worker's id on its claims", parse: func(c *Config, v string) error { return nonEmpty(&c.WorkerID, v) }},
		{env: "OUTBOX_LOG_LEVEL", flag: "log-level", def: "info", forOperatorCommands: true,
			usage: "debug, info, warn or error", parse: func(c *Config, v string) error { return c.LogLevel.UnmarshalText([]byte(v)) }},
		{env: "OUTBOX_LOG_FORMAT", flag: "log-format", def: "auto", forOperatorCommands: true,
			usage: "auto (text on a terminal, else json), json or text", parse: func(c *Config, v string) error { return oneOf(&c.LogFormat, v, "auto", "json", "text") }},
		{env: "OUTBOX_ORDERING", flag: "ordering", def: claim.OrderingAggregate, fields: []string{"claim.Ordering"},
			usage: "aggregate: events of one aggregate are published in createdAt order; none: no order", parse: func(c *Config, v string) error {
				return oneOf(&c.Ordering, v, claim.OrderingAggregate, claim.OrderingNone)
			}},
		{env: "OUTBOX_ORDERING_AFTER_FAILED", flag: "ordering-after-failed", def: claim.AfterFailedWait, forOperatorCommands: true, fields: []string{"claim.AfterFailed"},
			usage: "wait: later events of an aggregate wait behind a FAILED one until it is requeued or skipped; continue: they flow", parse: func(c *Config, v string) error {
				return oneOf(&c.OrderingAfterFailed, v, claim.AfterFailedWait, claim.AfterFailedContinue)
			}},
		{env: "OUTBOX_PPROF", flag: "pprof", def: "false",
			usage: "serve /debug/pprof/ on the HTTP address (for profiling; keep the address private)", parse: func(c *Config, v string) error { return parseBool(&c.Pprof, v) }},
	}
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
		if kind == operatorCommand && !s.forOperatorCommands {
			continue
		}
		chosen = append(chosen, s)
		values[s.flag] = fs.String(s.flag, "", fmt.Sprintf("%s (env %s, default %q)", s.usage, s.env, redactSetting(s.def)))
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
	if kind == relayCommand {
		cfg.MemoryLimit = readMemoryLimit(getenv)
		if err := cfg.validate(); err != nil {
			return Config{}, nil, settingError(err, chosen, sources)
		}
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
	return fmt.Errorf("%w: invalid %s %q: %s", ErrUsage, name, redactSetting(src.value), why)
}

// settingError is err as a usage error. A package Config's *rule.Error
// becomes the error of the setting that set the field, in the settings'
// names: claim's "RetryMax 1ms: want at least RetryMin (1s)" is
// OUTBOX_RETRY_MAX's "want at least OUTBOX_RETRY_MIN (1s)".
func settingError(err error, chosen []setting, sources map[string]source) error {
	var bad *rule.Error
	if !errors.As(err, &bad) {
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	s, ok := settingOf(chosen, bad.Config, bad.Field)
	if !ok {
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	want := bad.Want
	if other, ok := settingOf(chosen, bad.Config, bad.Bound); ok {
		want = strings.Replace(want, bad.Bound, other.env, 1)
	}
	return invalidSetting(s, sources[s.env], "want "+want)
}

// settingOf finds the setting that sets the field of the package Config
// named config.
func settingOf(settings []setting, config, field string) (setting, bool) {
	i := slices.IndexFunc(settings, func(s setting) bool { return slices.Contains(s.fields, config+"."+field) })
	if i < 0 {
		return setting{}, false
	}
	return settings[i], true
}

// validate derives what was left to be derived, checks what no single
// setting can check alone, then validates the package Configs the settings
// make: the ranges of the settings are their rules.
func (c *Config) validate() error {
	if c.BatchBytesAuto {
		c.BatchBytes = batchBytesFor(c.MemoryLimit.Bytes)
	}
	derived := c.PublishTimeout == 0
	if derived {
		c.PublishTimeout = derivedPublishTimeout(c.StaleAfter)
	}
	if err := c.checkStaleMargin(derived); err != nil {
		return err
	}
	for _, pc := range []interface{ Validate() error }{c.claimConfig(), c.recoveryConfig(), c.retentionConfig(), c.brokerConfig()} {
		if err := pc.Validate(); err != nil {
			return err
		}
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

// claimConfig, recoveryConfig, retentionConfig and brokerConfig are the
// package Configs the settings make: validate checks them, newWorker adds
// what it wires (stores, clocks, loggers, metrics). Validate applies no
// defaults, so a field that no setting sets takes its package's default
// here.
func (c Config) claimConfig() claim.Config {
	return claim.Config{
		WorkerID: c.WorkerID, Schedule: c.ClaimSchedule, BatchSize: c.BatchSize, BatchBytes: c.BatchBytes,
		MaxAttempts: c.MaxAttempts, MaxBodyBytes: c.MaxMessageBytes, PublishTimeout: c.PublishTimeout,
		RetryMin: c.RetryMin, RetryMax: c.RetryMax, StaleAfter: c.StaleAfter,
		Ordering: c.Ordering, AfterFailed: c.OrderingAfterFailed,
	}
}

func (c Config) recoveryConfig() recovery.Config {
	return recovery.Config{Schedule: c.RecoverySchedule, StaleAfter: c.StaleAfter, MaxAttempts: c.MaxAttempts}
}

func (c Config) retentionConfig() retention.Config {
	return retention.Config{
		Retention: c.Retention,
		Schedule:  retention.ScheduleDefault, BatchSize: retention.BatchSizeDefault, MaxRunTime: retention.MaxRunTimeDefault,
	}
}

func (c Config) brokerConfig() broker.Config {
	return broker.Config{
		// The confirm window holds a whole batch.
		URL: c.AMQPURL, Exchange: c.AMQPExchange, Window: max(broker.WindowDefault, c.BatchSize),
		// A broker that stops reading fails a write within the publish timeout.
		WriteTimeout: c.PublishTimeout,
		ReconnectMin: broker.ReconnectMinDefault, ReconnectMax: broker.ReconnectMaxDefault,
	}
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
	if err := parseInt(&c.BatchBytes, v); err != nil {
		return errors.New("want auto or a whole number of bytes")
	}
	return nil
}

func parsePublishTimeout(c *Config, v string) error {
	if v == "auto" {
		c.PublishTimeout = 0 // derived by validate
		return nil
	}
	if err := parseDurationAtLeast(&c.PublishTimeout, v, time.Millisecond); err != nil {
		return errors.New("want auto or a duration such as 5s (at least 1ms)")
	}
	return nil
}

func nonEmpty(dst *string, v string) error {
	if v == "" {
		return errors.New("must not be empty")
	}
	*dst = v
	return nil
}

func oneOf(dst *string, v string, allowed ...string) error {
	for _, a := range allowed {
		if v == a {
			*dst = v
			return nil
		}
	}
	return fmt.Errorf("want one of %s", strings.Join(allowed, ", "))
}

func parseBool(dst *bool, v string) error {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return errors.New("want true or false")
	}
	*dst = b
	return nil
}

func parseInt(dst *int, v string) error {
	n, err := strconv.Atoi(v)
	if err != nil {
		return errors.New("want a whole number")
	}
	*dst = n
	return nil
}

func parseDuration(dst *time.Duration, v string) error {
	d, err := time.ParseDuration(v)
	if err != nil {
		return errors.New("want a duration such as 30s, 5m or 168h")
	}
	*dst = d
	return nil
}

// parseDurationAtLeast is parseDuration for a setting that no package
// Config checks.
func parseDurationAtLeast(dst *time.Duration, v string, least time.Duration) error {
	var d time.Duration
	if err := parseDuration(&d, v); err != nil {
		return err
	}
	if d < least {
		return fmt.Errorf("want at least %s", least)
	}
	*dst = d
	return nil
}

func parseSchedule(dst *string, v string) error {
	if _, err := schedule.Parse(v); err != nil {
		return errors.New("want a cron schedule: five fields such as */2 * * * *, or @every 1s")
	}
	*dst = v
	return nil
}

func parseAddr(dst *string, v string) error {
	if _, _, err := net.SplitHostPort(v); err != nil {
		return errors.New("want host:port or :port")
	}
	*dst = v
	return nil
}

func parseMongoURI(dst *string, v string) error {
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "mongodb" && u.Scheme != "mongodb+srv") || u.Host == "" {
		return errors.New("want mongodb://host:port or mongodb+srv://host")
	}
	*dst = v
	return nil
}

// parseWriteConcern accepts "majority" or a number of members from 1 to
// 50. w: 0 is refused: an unacknowledged write would hide whether a claim
// or a fenced mark took.
func parseWriteConcern(dst *string, v string) error {
	if v == "majority" {
		*dst = v
		return nil
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 1 && n <= 50 {
		*dst = strconv.Itoa(n)
		return nil
	}
	return errors.New("want majority or a number of members from 1 to 50 (0, unacknowledged, is not allowed)")
}

// mongoReadConcern is the read concern of OUTBOX_MONGO_READ_CONCERN.
func (c Config) mongoReadConcern() *readconcern.ReadConcern {
	return &readconcern.ReadConcern{Level: c.MongoReadConcern}
}

// mongoWriteConcern is the write concern of OUTBOX_MONGO_WRITE_CONCERN and
// OUTBOX_MONGO_JOURNAL.
func (c Config) mongoWriteConcern() *writeconcern.WriteConcern {
	wc := &writeconcern.WriteConcern{W: c.MongoWriteConcern, Journal: &c.MongoJournal}
	if n, err := strconv.Atoi(c.MongoWriteConcern); err == nil {
		wc.W = n
	}
	return wc
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
