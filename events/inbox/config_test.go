package inbox

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace/noop"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		edit func(*Config)
		want string // substring of the error; empty for none
	}{
		{"defaults", func(*Config) {}, ""},
		{"max attempts", func(c *Config) { c.MaxAttempts = -1 }, "MaxAttempts -1"},
		{"retention", func(c *Config) { c.Retention = time.Minute }, "Retention 1m0s"},
		{"cleanup interval", func(c *Config) { c.CleanupInterval = time.Millisecond }, "CleanupInterval 1ms"},
		{"ack batch", func(c *Config) { c.AckBatch = 20000 }, "AckBatch 20000"},
		{"retry pause", func(c *Config) { c.RetryPause = -time.Second }, "RetryPause -1s"},
		{"queue type quorum", func(c *Config) { c.QueueType = QueueQuorum }, ""},
		{"queue type stream", func(c *Config) { c.QueueType = "stream" }, "QueueType"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var c Config
			tt.edit(&c)
			c.setDefaults()
			err := c.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Validate() = %v, want an error naming %q", err, tt.want)
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	var c Config
	c.setDefaults()
	got := []any{c.Database, c.Collection, c.MaxAttempts, c.QueueType, c.Retention, c.CleanupInterval, c.AckBatch, c.RetryPause}
	want := []any{DatabaseDefault, CollectionDefault, MaxAttemptsDefault, QueueClassic, RetentionDefault, CleanupIntervalDefault, AckBatchDefault, RetryPauseDefault}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("default %d = %v, want %v", i, got[i], want[i])
		}
	}
}

func TestQueueTypeOf(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args amqp.Table
		want string
	}{
		{nil, QueueClassic},
		{amqp.Table{"x-queue-type": "classic"}, QueueClassic},
		{amqp.Table{"x-queue-type": "quorum"}, QueueQuorum},
		{amqp.Table{"x-queue-type": "stream"}, QueueClassic},
		{amqp.Table{"x-single-active-consumer": true}, QueueClassic},
	} {
		if got := QueueTypeOf(tt.args); got != tt.want {
			t.Errorf("QueueTypeOf(%v) = %q, want %q", tt.args, got, tt.want)
		}
	}
}

func TestMetricsRegisteredTwice(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	if _, err := newMetrics(reg); err != nil {
		t.Fatalf("first registration: %v", err)
	}
	if _, err := newMetrics(reg); err == nil {
		t.Error("second registration on the same registry: no error, want one saying one Inbox per Registerer")
	}
	names := map[string]bool{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, n := range []string{"outbox_inbox_rejected_total", "outbox_inbox_processed_total", "outbox_inbox_duplicates_total",
		"outbox_inbox_handler_errors_total", "outbox_inbox_handler_duration_seconds", "outbox_inbox_expired_total"} {
		if !names[n] {
			t.Errorf("metric %s not exported", n)
		}
	}
}

// TestTracerProviderDefaultsToTheGlobal: as OpenTelemetry's instrumentation
// libraries do, the inbox takes the global provider unless given one.
func TestTracerProviderDefaultsToTheGlobal(t *testing.T) {
	t.Parallel()
	var c Config
	c.setDefaults()
	if c.TracerProvider != otel.GetTracerProvider() {
		t.Errorf("TracerProvider = %T, want the global %T", c.TracerProvider, otel.GetTracerProvider())
	}
	given := noop.NewTracerProvider()
	c = Config{TracerProvider: given}
	c.setDefaults()
	if c.TracerProvider != given {
		t.Errorf("TracerProvider = %T, want the one given", c.TracerProvider)
	}
}
