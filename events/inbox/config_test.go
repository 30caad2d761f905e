package inbox

import (
	"strings"
	"testing"
	"time"

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

// A Config without Metrics counts nothing and calls nothing: every nil
// function becomes a no-op.
func TestMetricsDefaults(t *testing.T) {
	t.Parallel()
	m := Metrics{}.withDefaults()
	m.Processed()
	m.Duplicate()
	m.HandlerError()
	m.Rejected(ReasonMaxAttempts)
	m.Handled(time.Second)
	m.Expired(1)
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
