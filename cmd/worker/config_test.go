package main

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxrelay/outbox/claim"
	"github.com/outboxrelay/outbox/internal/telemetry"
)

// envOf returns a getenv that reads only m.
func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// environOf returns m as os.Environ would: KEY=value entries.
func environOf(m map[string]string) []string {
	var out []string
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	return out
}

// defaultConfig is the configuration of a worker given no setting at all,
// as docs/configuration.md states it.
func defaultConfig() Config {
	return Config{
		MongoURI:         "mongodb://localhost:27017",
		MongoDatabase:    "outbox",
		MongoCollection:  "events",
		AMQPURL:          "amqp://guest:guest@localhost:5672/",
		AMQPExchange:     "events",
		ClaimSchedule:    "@every 1s",
		ClaimIdleMax:     0, // auto
		WakeOnInsert:     true,
		BatchSize:        500,
		BatchBytes:       64 << 20,
		BatchBytesAuto:   true,
		RecoverySchedule: "*/2 * * * *",
		StaleAfter:       60 * time.Second,
		MaxAttempts:      10,
		RetryMin:         claim.RetryMinDefault,
		RetryMax:         claim.RetryMaxDefault,
		PublishTimeout:   30 * time.Second,
		MaxMessageBytes:  claim.MaxBodyBytesDefault,
		Retention:        7 * 24 * time.Hour,
		HTTPAddr:         ":8080",
		ConsoleConfig:    ConsoleConfig{ConsoleAddr: "127.0.0.1:8090", ConsoleRequeueRate: 100, ConsoleActionMax: 1000, ConsoleActionsPerMinute: 30, ConsoleSignInFailures: 10, ConsoleOIDCRolesClaim: "roles", ConsoleOIDCScopes: []string{"profile", "email"}},
		ShutdownTimeout:  30 * time.Second,
		WorkerID:         defaultWorkerID(),
		LogLevel:         slog.LevelInfo,
		LogFormat:        "auto",

		Ordering:            claim.OrderingAggregate,
		OrderingAfterFailed: claim.AfterFailedWait,
		TraceParent:         "link",
		TraceMessage:        "producer",

		MessageFormat:     "plain",
		CloudEventsSource: "/outbox/outbox/events",
		CloudEventsPrefix: "cloudEvents_",

		MongoReadConcern:  "majority",
		MongoWriteConcern: "majority",
		MongoJournal:      true,

		DiscoveryInterval: 30 * time.Second,
		Setup:             "auto",
	}
}

func TestLoadConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want func(c *Config) // changes to defaultConfig()
	}{
		{
			name: "defaults",
			want: func(*Config) {},
		},
		{
			name: "every environment variable",
			env: map[string]string{
				"OUTBOX_MONGO_URI":            "mongodb://db.internal:27018/?replicaSet=rs0",
				"OUTBOX_MONGO_DATABASE":       "shop",
				"OUTBOX_MONGO_COLLECTION":     "outbox_events",
				"OUTBOX_AMQP_URL":             "amqps://relay:pw@mq.internal:5671/prod",
				"OUTBOX_AMQP_EXCHANGE":        "shop.events",
				"OUTBOX_CLAIM_SCHEDULE":       "@every 250ms",
				"OUTBOX_BATCH_SIZE":           "1000",
				"OUTBOX_BATCH_BYTES":          "8388608",
				"OUTBOX_RECOVERY_SCHEDULE":    "* * * * *",
				"OUTBOX_STALE_AFTER":          "5m",
				"OUTBOX_MAX_ATTEMPTS":         "3",
				"OUTBOX_RETRY_MIN":            "2s",
				"OUTBOX_RETRY_MAX":            "10m",
				"OUTBOX_PUBLISH_TIMEOUT":      "1m",
				"OUTBOX_MAX_MESSAGE_BYTES":    "1048576",
				"OUTBOX_RETENTION":            "0",
				"OUTBOX_HTTP_ADDR":            "127.0.0.1:9090",
				"OUTBOX_HTTP_TOKEN":           "0123456789abcdef",
				"OUTBOX_PPROF_ADDR":           "[::1]:6060",
				"OUTBOX_CONSOLE_ADDR":         "127.0.0.1:9091",
				"OUTBOX_CONSOLE_WRITES":       "true",
				"OUTBOX_CONSOLE_TOKEN":        "console-token-0123",
				"OUTBOX_CONSOLE_REQUEUE_RATE": "50",
				"OUTBOX_SHUTDOWN_TIMEOUT":     "45s",
				"OUTBOX_WORKER_ID":            "relay-7",
				"OUTBOX_LOG_LEVEL":            "debug",
				"OUTBOX_LOG_FORMAT":           "text",
				"OUTBOX_ORDERING":             "none",

				"OUTBOX_ORDERING_AFTER_FAILED": "continue",
				"OUTBOX_MESSAGE_FORMAT":        "cloudevents-structured",
				"OUTBOX_CLOUDEVENTS_SOURCE":    "https://shop.example/orders",
				"OUTBOX_CLOUDEVENTS_PREFIX":    "ce-",
				"OUTBOX_TRACE_PARENT":          "child",
				"OUTBOX_TRACE_MESSAGE":         "publish",
				"OUTBOX_TRACE_MONGO":           "true",

				"OUTBOX_MONGO_READ_CONCERN":  "local",
				"OUTBOX_MONGO_WRITE_CONCERN": "2",
				"OUTBOX_MONGO_JOURNAL":       "false",
				"OUTBOX_SETUP":               "check",
			},
			want: func(c *Config) {
				c.MongoReadConcern, c.MongoWriteConcern, c.MongoJournal = "local", "2", false
				c.Setup = "check"
				c.MongoURI = "mongodb://db.internal:27018/?replicaSet=rs0"
				c.MongoDatabase = "shop"
				c.MongoCollection = "outbox_events"
				c.AMQPURL = "amqps://relay:pw@mq.internal:5671/prod"
				c.AMQPExchange = "shop.events"
				c.ClaimSchedule = "@every 250ms"
				c.BatchSize = 1000
				c.BatchBytes, c.BatchBytesAuto = 8<<20, false
				c.RecoverySchedule = "* * * * *"
				c.StaleAfter = 5 * time.Minute
				c.MaxAttempts = 3
				c.RetryMin = 2 * time.Second
				c.RetryMax = 10 * time.Minute
				c.PublishTimeout = time.Minute
				c.MaxMessageBytes = 1 << 20
				c.Retention = 0
				c.HTTPAddr = "127.0.0.1:9090"
				c.HTTPToken, c.PprofAddr = "0123456789abcdef", "[::1]:6060"
				c.ConsoleAddr = "127.0.0.1:9091"
				c.ConsoleWrites, c.ConsoleToken, c.ConsoleRequeueRate = true, "console-token-0123", 50
				c.ShutdownTimeout = 45 * time.Second
				c.WorkerID = "relay-7"
				c.LogLevel = slog.LevelDebug
				c.LogFormat = "text"
				c.Ordering, c.OrderingAfterFailed = claim.OrderingNone, claim.AfterFailedContinue
				c.TraceParent, c.TraceMessage, c.TraceMongo = "child", "publish", true
				c.MessageFormat, c.CloudEventsSource = "cloudevents-structured", "https://shop.example/orders"
				c.CloudEventsPrefix = "ce-"
			},
		},
		{
			name: "tracing over OTLP/gRPC, from OpenTelemetry's variables",
			env: map[string]string{
				"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
				"OTEL_EXPORTER_OTLP_HEADERS": "api-key=k1",
			},
			want: func(c *Config) {
				c.Tracing = telemetry.Config{Enabled: true, Protocol: "grpc", Secrets: []string{"k1"}}
			},
		},
		{
			name: "cloudevents source derived from the database and collection, escaped",
			env: map[string]string{"OUTBOX_MESSAGE_FORMAT": "cloudevents-binary",
				"OUTBOX_MONGO_DATABASE": "my shop", "OUTBOX_MONGO_COLLECTION": "outbox"},
			want: func(c *Config) {
				c.MessageFormat, c.MongoDatabase, c.MongoCollection = "cloudevents-binary", "my shop", "outbox"
				c.CloudEventsSource = "/outbox/my%20shop/outbox"
			},
		},
		{
			name: "surrounding spaces are trimmed",
			env:  map[string]string{"OUTBOX_BATCH_SIZE": " 42 ", "OUTBOX_WORKER_ID": "\tw-1\n"},
			want: func(c *Config) { c.BatchSize, c.WorkerID = 42, "w-1" },
		},
		{
			name: "flag beats env",
			args: []string{"--batch-size", "200", "--worker-id=from-flag", "--stale-after=2m"},
			env: map[string]string{
				"OUTBOX_BATCH_SIZE":  "100",
				"OUTBOX_WORKER_ID":   "from-env",
				"OUTBOX_STALE_AFTER": "90s",
				"OUTBOX_LOG_LEVEL":   "warn", // no flag: env still applies
			},
			want: func(c *Config) {
				c.BatchSize, c.WorkerID, c.StaleAfter = 200, "from-flag", 2*time.Minute
				c.LogLevel = slog.LevelWarn
			},
		},
		{
			name: "stale threshold just above publish timeout plus its margin",
			env:  map[string]string{"OUTBOX_PUBLISH_TIMEOUT": "5s", "OUTBOX_STALE_AFTER": "7001ms"},
			want: func(c *Config) { c.PublishTimeout, c.StaleAfter = 5*time.Second, 7001*time.Millisecond },
		},
		{
			name: "a 30s publish timeout keeps its 10s margin",
			env:  map[string]string{"OUTBOX_PUBLISH_TIMEOUT": "30s", "OUTBOX_STALE_AFTER": "41s"},
			want: func(c *Config) { c.PublishTimeout, c.StaleAfter = 30*time.Second, 41*time.Second },
		},
		{
			name: "stale after alone derives the publish timeout",
			env:  map[string]string{"OUTBOX_STALE_AFTER": "10s"},
			want: func(c *Config) { c.StaleAfter, c.PublishTimeout = 10*time.Second, 5*time.Second },
		},
		{
			name: "stale after alone, derived publish timeout capped at its default",
			env:  map[string]string{"OUTBOX_STALE_AFTER": "10m"},
			want: func(c *Config) { c.StaleAfter, c.PublishTimeout = 10*time.Minute, 30*time.Second },
		},
		{
			name: "publish timeout auto by name",
			env:  map[string]string{"OUTBOX_STALE_AFTER": "45s", "OUTBOX_PUBLISH_TIMEOUT": "auto"},
			want: func(c *Config) { c.StaleAfter, c.PublishTimeout = 45*time.Second, 22500*time.Millisecond },
		},
		{
			name: "amqp url list with a comma in a password",
			env:  map[string]string{"OUTBOX_AMQP_URL": "amqp://relay:p,w@mq-1:5672/,amqp://relay:p,w@mq-2:5672/"},
			want: func(c *Config) { c.AMQPURL = "amqp://relay:p,w@mq-1:5672/,amqp://relay:p,w@mq-2:5672/" },
		},
		{
			name: "wake-up on insert off",
			env:  map[string]string{"OUTBOX_WAKE_ON_INSERT": "false"},
			want: func(c *Config) { c.WakeOnInsert = false },
		},
		{
			name: "log format json",
			env:  map[string]string{"OUTBOX_LOG_FORMAT": "json"},
			want: func(c *Config) { c.LogFormat = "json" },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, _, err := loadConfig("run", tt.args, envOf(tt.env), relayCommand, nil)
			if err != nil {
				t.Fatalf("loadConfig: %v", err)
			}
			want := defaultConfig()
			tt.want(&want)
			// Without a fleet file the settings describe one outbox,
			// exactly as they did before there were fleets; at auto its
			// claims do not back off when idle.
			one := want
			if one.ClaimIdleMax == 0 {
				one.ClaimIdleMax = claim.DelayMin
			}
			want.Outboxes = []outboxConfig{{Name: implicitOutbox, Config: one}}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("loadConfig (-want +got):\n%s", diff)
			}
		})
	}
}

// secretEnv holds valid settings whose URIs carry the password "secret",
// so that every error below is also checked for leaking it.
func secretEnv() map[string]string {
	return map[string]string{
		"OUTBOX_MONGO_URI": "mongodb://relay:secret@127.0.0.1:27017/",
		"OUTBOX_AMQP_URL":  "amqp://relay:secret@127.0.0.1:5672/",
	}
}

func TestLoadConfigRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		env  map[string]string
		// want are substrings of the error: the variable and the value.
		want []string
	}{
		{name: "message format unknown", env: map[string]string{"OUTBOX_MESSAGE_FORMAT": "cloudevents"},
			want: []string{"OUTBOX_MESSAGE_FORMAT", `"cloudevents"`, "want one of plain, cloudevents-binary, cloudevents-structured"}},
		{name: "cloudevents source with a space", env: map[string]string{"OUTBOX_CLOUDEVENTS_SOURCE": "/orders service"},
			want: []string{"OUTBOX_CLOUDEVENTS_SOURCE", `"/orders service"`, "URI-reference"}},
		{name: "cloudevents source with a bad escape", args: []string{"--cloudevents-source", "/a%zz"},
			want: []string{"OUTBOX_CLOUDEVENTS_SOURCE (--cloudevents-source)", `"/a%zz"`, "escape"}},
		{name: "cloudevents prefix of the HTTP binding's spelling", env: map[string]string{"OUTBOX_CLOUDEVENTS_PREFIX": "CE-"},
			want: []string{"OUTBOX_CLOUDEVENTS_PREFIX", `"CE-"`, "want one of cloudEvents_, cloudEvents:, ce-"}},
		{name: "batch size not a number", env: map[string]string{"OUTBOX_BATCH_SIZE": "abc"},
			want: []string{"OUTBOX_BATCH_SIZE", `"abc"`}},
		{name: "batch size zero", env: map[string]string{"OUTBOX_BATCH_SIZE": "0"},
			want: []string{"OUTBOX_BATCH_SIZE", `"0"`, "1 to 10000"}},
		{name: "batch size too large", env: map[string]string{"OUTBOX_BATCH_SIZE": "10001"},
			want: []string{"OUTBOX_BATCH_SIZE", `"10001"`}},
		{name: "batch bytes zero", env: map[string]string{"OUTBOX_BATCH_BYTES": "0"},
			want: []string{"OUTBOX_BATCH_BYTES", `"0"`}},
		{name: "batch bytes not a number", env: map[string]string{"OUTBOX_BATCH_BYTES": "64MiB"},
			want: []string{"OUTBOX_BATCH_BYTES", `"64MiB"`}},
		{name: "stale after negative", env: map[string]string{"OUTBOX_STALE_AFTER": "-1s"},
			want: []string{"OUTBOX_STALE_AFTER", `"-1s"`}},
		{name: "stale after not a duration", env: map[string]string{"OUTBOX_STALE_AFTER": "soon"},
			want: []string{"OUTBOX_STALE_AFTER", `"soon"`}},
		{name: "claim schedule not cron", env: map[string]string{"OUTBOX_CLAIM_SCHEDULE": "every second"},
			want: []string{"OUTBOX_CLAIM_SCHEDULE", `"every second"`}},
		{name: "recovery schedule not cron", env: map[string]string{"OUTBOX_RECOVERY_SCHEDULE": "*/2 * *"},
			want: []string{"OUTBOX_RECOVERY_SCHEDULE", `"*/2 * *"`}},
		{name: "mongo uri not mongodb", env: map[string]string{"OUTBOX_MONGO_URI": "http://x"},
			want: []string{"OUTBOX_MONGO_URI", `"http://x"`}},
		{name: "mongo uri without host keeps the password hidden", env: map[string]string{"OUTBOX_MONGO_URI": "mongodb://user:secret@"},
			want: []string{"OUTBOX_MONGO_URI", "mongodb://user:"}},
		{name: "amqp url without host keeps the password hidden", env: map[string]string{"OUTBOX_AMQP_URL": "amqp://user:secret@"},
			want: []string{"OUTBOX_AMQP_URL", "amqp://user:"}},
		{name: "amqp url of another scheme", env: map[string]string{"OUTBOX_AMQP_URL": "https://user:secret@mq:443/"},
			want: []string{"OUTBOX_AMQP_URL", "https://user:"}},
		{name: "http addr without host", env: map[string]string{"OUTBOX_HTTP_ADDR": "8080"},
			want: []string{"OUTBOX_HTTP_ADDR", `"8080"`}},
		{name: "pprof on every interface", env: map[string]string{"OUTBOX_PPROF_ADDR": ":6060"},
			want: []string{"OUTBOX_PPROF_ADDR", `":6060"`, "loopback"}},
		{name: "pprof on another host's address", args: []string{"--pprof-addr", "10.0.0.5:6060"},
			want: []string{"OUTBOX_PPROF_ADDR", "--pprof-addr", `"10.0.0.5:6060"`, "loopback"}},
		{name: "http token too short, not shown", env: map[string]string{"OUTBOX_HTTP_TOKEN": "secret"},
			want: []string{"OUTBOX_HTTP_TOKEN", `"<redacted>"`, "at least 16"}},
		{name: "http token with a space, not shown", env: map[string]string{"OUTBOX_HTTP_TOKEN": "secret secret secret"},
			want: []string{"OUTBOX_HTTP_TOKEN", `"<redacted>"`, "no spaces"}},
		{name: "log level unknown", env: map[string]string{"OUTBOX_LOG_LEVEL": "loud"},
			want: []string{"OUTBOX_LOG_LEVEL", `"loud"`}},
		{name: "log format unknown", env: map[string]string{"OUTBOX_LOG_FORMAT": "xml"},
			want: []string{"OUTBOX_LOG_FORMAT", `"xml"`}},
		{name: "ordering unknown", env: map[string]string{"OUTBOX_ORDERING": "strict"},
			want: []string{"OUTBOX_ORDERING", `"strict"`, "aggregate, none"}},
		{name: "ordering after failed unknown", env: map[string]string{"OUTBOX_ORDERING_AFTER_FAILED": "skip"},
			want: []string{"OUTBOX_ORDERING_AFTER_FAILED", `"skip"`, "wait, continue"}},
		{name: "read concern unknown", env: map[string]string{"OUTBOX_MONGO_READ_CONCERN": "available"},
			want: []string{"OUTBOX_MONGO_READ_CONCERN", `"available"`, "majority, local"}},
		{name: "write concern unacknowledged", env: map[string]string{"OUTBOX_MONGO_WRITE_CONCERN": "0"},
			want: []string{"OUTBOX_MONGO_WRITE_CONCERN", `"0"`, "not allowed"}},
		{name: "write concern a word", env: map[string]string{"OUTBOX_MONGO_WRITE_CONCERN": "all"},
			want: []string{"OUTBOX_MONGO_WRITE_CONCERN", `"all"`}},
		{name: "journal not a boolean", env: map[string]string{"OUTBOX_MONGO_JOURNAL": "yes"},
			want: []string{"OUTBOX_MONGO_JOURNAL", `"yes"`}},
		{name: "max attempts zero", env: map[string]string{"OUTBOX_MAX_ATTEMPTS": "0"},
			want: []string{"OUTBOX_MAX_ATTEMPTS", `"0"`}},
		{name: "shutdown timeout below a second", env: map[string]string{"OUTBOX_SHUTDOWN_TIMEOUT": "500ms"},
			want: []string{"OUTBOX_SHUTDOWN_TIMEOUT", `"500ms"`}},
		{name: "worker id blank", env: map[string]string{"OUTBOX_WORKER_ID": "   "},
			// A blank value counts as unset only before trimming; after
			// trimming it must not become an empty worker id.
			want: []string{"OUTBOX_WORKER_ID"}},
		{name: "stale after below publish timeout plus its margin",
			env: map[string]string{"OUTBOX_STALE_AFTER": "15s", "OUTBOX_PUBLISH_TIMEOUT": "12s"},
			// What to change: raise one, or leave the other to be derived.
			want: []string{"OUTBOX_STALE_AFTER 15s", "OUTBOX_PUBLISH_TIMEOUT (12s)", "by more than 4s", "above 16s", "lower OUTBOX_PUBLISH_TIMEOUT", "derived: 7.5s"}},
		{name: "stale after equal to a 30s publish timeout plus 10s",
			env:  map[string]string{"OUTBOX_STALE_AFTER": "40s", "OUTBOX_PUBLISH_TIMEOUT": "30s"},
			want: []string{"OUTBOX_STALE_AFTER 40s", "OUTBOX_PUBLISH_TIMEOUT (30s)", "by more than 10s"}},
		{name: "stale after alone too short for any publish timeout",
			env:  map[string]string{"OUTBOX_STALE_AFTER": "3s"},
			want: []string{"OUTBOX_STALE_AFTER 3s", "OUTBOX_PUBLISH_TIMEOUT auto: 1.5s", "set OUTBOX_STALE_AFTER to 5s or more"}},
		{name: "publish timeout neither auto nor a duration",
			env:  map[string]string{"OUTBOX_PUBLISH_TIMEOUT": "soon"},
			want: []string{"OUTBOX_PUBLISH_TIMEOUT", `"soon"`, "auto"}},
		{name: "amqp url list with a bad second url",
			env:  map[string]string{"OUTBOX_AMQP_URL": "amqp://relay:secret@mq-1:5672/,amqp://relay:secret@"},
			want: []string{"OUTBOX_AMQP_URL", "URL 2 of 2"}},
		{name: "retry max below retry min",
			env:  map[string]string{"OUTBOX_RETRY_MIN": "1m", "OUTBOX_RETRY_MAX": "10s"},
			want: []string{"OUTBOX_RETRY_MAX", "10s", "1m"}},
		{name: "bad flag value names flag and variable", args: []string{"--batch-size=abc"},
			want: []string{"OUTBOX_BATCH_SIZE", "--batch-size", `"abc"`}},
		{name: "bad flag value beats good env", args: []string{"--amqp-url", "amqp://user:secret@"},
			env:  map[string]string{"OUTBOX_AMQP_URL": "amqp://guest:guest@127.0.0.1:5672/"},
			want: []string{"OUTBOX_AMQP_URL", "--amqp-url", "amqp://user:"}},
		{name: "unknown flag", args: []string{"--batch"},
			want: []string{"-batch"}},
		{name: "flag without value", args: []string{"--batch-size"},
			want: []string{"-batch-size"}},
		{name: "unexpected argument", args: []string{"--batch-size", "100", "stats"},
			want: []string{`"stats"`}},
		{name: "trace parent unknown", env: map[string]string{"OUTBOX_TRACE_PARENT": "sibling"},
			want: []string{"OUTBOX_TRACE_PARENT", `"sibling"`, "link, child"}},
		{name: "trace message unknown", env: map[string]string{"OUTBOX_TRACE_MESSAGE": "relay"},
			want: []string{"OUTBOX_TRACE_MESSAGE", `"relay"`, "producer, publish"}},
		{name: "trace mongo not a boolean", env: map[string]string{"OUTBOX_TRACE_MONGO": "on"},
			want: []string{"OUTBOX_TRACE_MONGO", `"on"`}},
		{name: "an exporter OpenTelemetry's Go SDK lacks", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"},
			want: []string{"OTEL_TRACES_EXPORTER", `"zipkin"`, "otlp or none"}},
		{name: "an unknown OTLP protocol", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http"},
			want: []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", `"http"`}},
		{name: "OTLP headers are never shown", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_HEADERS": "secret"},
			want: []string{"OTEL_EXPORTER_OTLP_HEADERS", "<redacted>"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := secretEnv()
			for k, v := range tt.env {
				env[k] = v
			}
			cfg, _, err := loadConfig("run", tt.args, envOf(env), relayCommand, nil)
			if err == nil {
				t.Fatalf("loadConfig: no error, config %+v", cfg)
			}
			if !errors.Is(err, ErrUsage) {
				t.Errorf("error does not wrap ErrUsage: %v", err)
			}
			msg := err.Error()
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error does not mention %q: %s", w, msg)
				}
			}
			if strings.Contains(msg, "secret") {
				t.Errorf("error leaks the password: %s", msg)
			}
		})
	}
}

// TestLoadConfigStoreOnly checks the settings of the operator commands:
// the store's settings apply, the relay's are not flags there.
func TestLoadConfigStoreOnly(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"OUTBOX_MONGO_DATABASE":  "shop",
		"OUTBOX_STALE_AFTER":     "5s", // below the relay's bound: fine for stats
		"OUTBOX_PUBLISH_TIMEOUT": "1m",
		"OUTBOX_BATCH_SIZE":      "abc", // not read by stats
	}
	cfg, _, err := loadConfig("stats", nil, envOf(env), operatorCommand, nil)
	if err != nil {
		t.Fatalf("loadConfig(stats): %v", err)
	}
	if cfg.MongoDatabase != "shop" || cfg.StaleAfter != 5*time.Second {
		t.Errorf("stats config: database %q stale after %s, want shop and 5s", cfg.MongoDatabase, cfg.StaleAfter)
	}
	_, _, err = loadConfig("stats", []string{"--batch-size=10"}, envOf(nil), operatorCommand, nil)
	if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "batch-size") {
		t.Errorf("stats --batch-size: error %v, want a usage error naming the flag", err)
	}
}

// TestSettingsNaming checks that every setting is an OUTBOX_ variable and
// a flag of the same name, as docs/configuration.md promises.
func TestSettingsNaming(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, s := range settings() {
		name, ok := strings.CutPrefix(s.env, "OUTBOX_")
		if !ok {
			t.Errorf("setting %q: variable lacks the OUTBOX_ prefix", s.env)
		}
		if want := strings.ReplaceAll(strings.ToLower(name), "_", "-"); s.flag != want {
			t.Errorf("setting %s: flag --%s, want --%s", s.env, s.flag, want)
		}
		if seen[s.env] {
			t.Errorf("setting %s listed twice", s.env)
		}
		seen[s.env] = true
		if s.usage == "" {
			t.Errorf("setting %s has no usage text", s.env)
		}
	}
}
