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
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/outboxrelay/outbox/broker"
	"github.com/outboxrelay/outbox/claim"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/recovery"
	"github.com/outboxrelay/outbox/retention"
	"github.com/outboxrelay/outbox/schedule"
)

// Config is every setting of the worker. Each comes from a flag, else from
// its environment variable, else from its default; docs/configuration.md
// lists them.
type Config struct {
	MongoURI         string
	MongoDatabase    string
	MongoCollection  string
	AMQPURL          string
	AMQPExchange     string
	ClaimSchedule    string
	BatchSize        int
	BatchBytes       int
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
	parse                 func(c *Config, v string) error
	storeOnly             bool // also needed by the stats, requeue and show commands
}

// ErrUsage marks a configuration error: the worker exits with code 2.
var ErrUsage = errors.New("usage")

func settings() []setting {
	return []setting{
		{env: "OUTBOX_MONGO_URI", flag: "mongo-uri", def: "mongodb://localhost:27017", storeOnly: true,
			usage: "MongoDB connection URI", parse: func(c *Config, v string) error { return parseMongoURI(&c.MongoURI, v) }},
		{env: "OUTBOX_MONGO_DATABASE", flag: "mongo-database", def: mongo.DatabaseDefault, storeOnly: true,
			usage: "database of the outbox collection", parse: func(c *Config, v string) error { return nonEmpty(&c.MongoDatabase, v) }},
		{env: "OUTBOX_MONGO_COLLECTION", flag: "mongo-collection", def: mongo.CollectionDefault, storeOnly: true,
			usage: "outbox collection", parse: func(c *Config, v string) error { return nonEmpty(&c.MongoCollection, v) }},
		{env: "OUTBOX_MONGO_READ_CONCERN", flag: "mongo-read-concern", def: "majority", storeOnly: true,
			usage: "read concern of every read (overrides the URI's readConcernLevel)", parse: func(c *Config, v string) error { return oneOf(&c.MongoReadConcern, v, "majority", "local") }},
		{env: "OUTBOX_MONGO_WRITE_CONCERN", flag: "mongo-write-concern", def: "majority", storeOnly: true,
			usage: "write concern w of every write (overrides the URI's w)", parse: func(c *Config, v string) error { return parseWriteConcern(&c.MongoWriteConcern, v) }},
		{env: "OUTBOX_MONGO_JOURNAL", flag: "mongo-journal", def: "true", storeOnly: true,
			usage: "writes wait for the journal (overrides the URI's journal)", parse: func(c *Config, v string) error { return parseBool(&c.MongoJournal, v) }},
		{env: "OUTBOX_AMQP_URL", flag: "amqp-url", def: "amqp://guest:guest@localhost:5672/",
			usage: "RabbitMQ URL", parse: func(c *Config, v string) error { return parseAMQPURL(&c.AMQPURL, v) }},
		{env: "OUTBOX_AMQP_EXCHANGE", flag: "amqp-exchange", def: broker.ExchangeDefault,
			usage: "topic exchange events are published to", parse: func(c *Config, v string) error { return nonEmpty(&c.AMQPExchange, v) }},
		{env: "OUTBOX_CLAIM_SCHEDULE", flag: "claim-schedule", def: claim.ScheduleDefault,
			usage: "cron schedule of claims", parse: func(c *Config, v string) error { return parseSchedule(&c.ClaimSchedule, v) }},
		{env: "OUTBOX_BATCH_SIZE", flag: "batch-size", def: strconv.Itoa(claim.BatchSizeDefault),
			usage: "most events one claim takes (1-10000)", parse: func(c *Config, v string) error { return parseInt(&c.BatchSize, v, 1, 10000) }},
		{env: "OUTBOX_BATCH_BYTES", flag: "batch-bytes", def: strconv.Itoa(claim.BatchBytesDefault),
			usage: "bound on the raw size of one claim's documents; the worker holds about three times it", parse: func(c *Config, v string) error { return parseInt(&c.BatchBytes, v, 1, 1<<34) }},
		{env: "OUTBOX_RECOVERY_SCHEDULE", flag: "recovery-schedule", def: recovery.ScheduleDefault,
			usage: "cron schedule of stale-claim recovery", parse: func(c *Config, v string) error { return parseSchedule(&c.RecoverySchedule, v) }},
		{env: "OUTBOX_STALE_AFTER", flag: "stale-after", def: recovery.StaleAfterDefault.String(), storeOnly: true,
			usage: "how long an event may stay PROCESSING before recovery takes it back", parse: func(c *Config, v string) error { return parseDuration(&c.StaleAfter, v, time.Second) }},
		{env: "OUTBOX_MAX_ATTEMPTS", flag: "max-attempts", def: strconv.Itoa(claim.MaxAttemptsDefault),
			usage: "claims an event gets before it becomes FAILED", parse: func(c *Config, v string) error { return parseInt(&c.MaxAttempts, v, 1, 1000) }},
		{env: "OUTBOX_RETRY_MIN", flag: "retry-min", def: claim.RetryMinDefault.String(),
			usage: "delay before the first retry of a failed publish", parse: func(c *Config, v string) error { return parseDuration(&c.RetryMin, v, time.Millisecond) }},
		{env: "OUTBOX_RETRY_MAX", flag: "retry-max", def: claim.RetryMaxDefault.String(),
			usage: "cap of the delay between retries", parse: func(c *Config, v string) error { return parseDuration(&c.RetryMax, v, time.Millisecond) }},
		{env: "OUTBOX_PUBLISH_TIMEOUT", flag: "publish-timeout", def: claim.PublishTimeoutDefault.String(),
			usage: "wait for one batch's confirms before its unconfirmed events go back to NEW", parse: func(c *Config, v string) error { return parseDuration(&c.PublishTimeout, v, time.Millisecond) }},
		{env: "OUTBOX_MAX_MESSAGE_BYTES", flag: "max-message-bytes", def: strconv.Itoa(claim.MaxBodyBytesDefault),
			usage: "largest message body; a larger event becomes FAILED", parse: func(c *Config, v string) error { return parseInt(&c.MaxMessageBytes, v, 1, 512<<20) }},
		{env: "OUTBOX_RETENTION", flag: "retention", def: retention.RetentionDefault.String(),
			usage: "how long PUBLISHED events are kept; 0 keeps them", parse: func(c *Config, v string) error { return parseDuration(&c.Retention, v, 0) }},
		{env: "OUTBOX_HTTP_ADDR", flag: "http-addr", def: ":8080",
			usage: "address of /healthz, /readyz, /metrics, /status and /trigger", parse: func(c *Config, v string) error { return parseAddr(&c.HTTPAddr, v) }},
		{env: "OUTBOX_SHUTDOWN_TIMEOUT", flag: "shutdown-timeout", def: "30s",
			usage: "how long a stop may take", parse: func(c *Config, v string) error { return parseDuration(&c.ShutdownTimeout, v, time.Second) }},
		{env: "OUTBOX_WORKER_ID", flag: "worker-id", def: defaultWorkerID(),
			usage: "this worker's id on its claims", parse: func(c *Config, v string) error { return nonEmpty(&c.WorkerID, v) }},
		{env: "OUTBOX_LOG_LEVEL", flag: "log-level", def: "info", storeOnly: true,
			usage: "debug, info, warn or error", parse: func(c *Config, v string) error { return c.LogLevel.UnmarshalText([]byte(v)) }},
		{env: "OUTBOX_LOG_FORMAT", flag: "log-format", def: "json", storeOnly: true,
			usage: "json or text", parse: func(c *Config, v string) error { return oneOf(&c.LogFormat, v, "json", "text") }},
		{env: "OUTBOX_ORDERING", flag: "ordering", def: claim.OrderingAggregate,
			usage: "aggregate: events of one aggregate are published in createdAt order; none: no order", parse: func(c *Config, v string) error {
				return oneOf(&c.Ordering, v, claim.OrderingAggregate, claim.OrderingNone)
			}},
		{env: "OUTBOX_ORDERING_AFTER_FAILED", flag: "ordering-after-failed", def: claim.AfterFailedWait, storeOnly: true,
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
func loadConfig(name string, args []string, getenv func(string) string, storeOnly bool, extra func(*flag.FlagSet)) (Config, []string, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var chosen []setting
	values := map[string]*string{}
	for _, s := range settings() {
		if storeOnly && !s.storeOnly {
			continue
		}
		chosen = append(chosen, s)
		values[s.flag] = fs.String(s.flag, "", fmt.Sprintf("%s (env %s, default %q)", s.usage, s.env, redactDefault(s.def)))
	}
	if extra != nil {
		extra(fs)
	}
	if err := fs.Parse(args); err != nil {
		return Config{}, nil, fmt.Errorf("%w: %s %v", ErrUsage, name, err)
	}
	if fs.NArg() > 0 {
		// `worker --batch-size 100 stats` must not start the relay.
		return Config{}, nil, fmt.Errorf("%w: %s: unexpected argument %q (commands come first; every setting is a flag)", ErrUsage, name, fs.Arg(0))
	}
	var cfg Config
	for _, s := range chosen {
		v, from := *values[s.flag], "--"+s.flag
		if v == "" {
			v, from = getenv(s.env), s.env
		}
		if v == "" {
			v, from = s.def, "default of "+s.env
		}
		if err := s.parse(&cfg, strings.TrimSpace(v)); err != nil {
			return Config{}, nil, fmt.Errorf("%w: invalid %s (%s) %q: %v", ErrUsage, s.env, from, redactDefault(v), err)
		}
	}
	if !storeOnly {
		if err := cfg.validate(); err != nil {
			return Config{}, nil, fmt.Errorf("%w: %v", ErrUsage, err)
		}
	}
	return cfg, fs.Args(), nil
}

// validate checks what no single setting can check alone.
func (c Config) validate() error {
	if c.RetryMax < c.RetryMin {
		return fmt.Errorf("invalid OUTBOX_RETRY_MAX %s: below OUTBOX_RETRY_MIN %s", c.RetryMax, c.RetryMin)
	}
	// A batch may take up to the publish timeout plus the writes after it.
	// A stale threshold below that would take batches back from healthy
	// workers and turn slow publishes into duplicates.
	if c.StaleAfter <= c.PublishTimeout+10*time.Second {
		return fmt.Errorf("invalid OUTBOX_STALE_AFTER %s: must exceed OUTBOX_PUBLISH_TIMEOUT (%s) by more than 10s, or healthy batches are taken back", c.StaleAfter, c.PublishTimeout)
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

func parseInt(dst *int, v string, lo, hi int) error {
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return fmt.Errorf("want a whole number from %d to %d", lo, hi)
	}
	*dst = n
	return nil
}

func parseDuration(dst *time.Duration, v string, least time.Duration) error {
	d, err := time.ParseDuration(v)
	if err != nil {
		return errors.New("want a duration such as 30s, 5m or 168h")
	}
	if d < least || d < 0 {
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

func parseAMQPURL(dst *string, v string) error {
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") || u.Host == "" {
		return errors.New("want amqp://user:password@host:port/vhost")
	}
	*dst = v
	return nil
}

// redactDefault hides a password in a value that may be a URL.
func redactDefault(v string) string {
	if strings.Contains(v, "://") {
		return broker.Redact(v)
	}
	return v
}
