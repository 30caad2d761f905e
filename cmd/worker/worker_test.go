package main

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxrelay/outbox/claim"
	"github.com/outboxrelay/outbox/internal/telemetry"
)

// TestNewWorkerTakesEveryValidConfig checks that settings at the edges of
// their ranges, which loadConfig accepts, make package Configs that their
// constructors accept too: the worker checks each setting once, as it
// parses it, and the services validate their Configs once, in newWorker.
func TestNewWorkerTakesEveryValidConfig(t *testing.T) {
	t.Parallel()
	tests := map[string]map[string]string{
		"defaults": {},
		"least": {
			"OUTBOX_BATCH_SIZE": "1", "OUTBOX_BATCH_BYTES": "1", "OUTBOX_MAX_ATTEMPTS": "1",
			"OUTBOX_MAX_MESSAGE_BYTES": "1", "OUTBOX_RETRY_MIN": "1ms", "OUTBOX_RETRY_MAX": "1ms",
			"OUTBOX_PUBLISH_TIMEOUT": "1ms", "OUTBOX_STALE_AFTER": "3s", "OUTBOX_RETENTION": "0",
		},
		"most": {
			"OUTBOX_BATCH_SIZE": strconv.Itoa(claim.BatchSizeMax), "OUTBOX_BATCH_BYTES": strconv.Itoa(claim.BatchBytesMax),
			"OUTBOX_MAX_ATTEMPTS": strconv.Itoa(claim.MaxAttemptsMax), "OUTBOX_MAX_MESSAGE_BYTES": strconv.Itoa(claim.MaxBodyBytesMax),
		},
		"a list of broker nodes": {"OUTBOX_AMQP_URL": "amqp://a:5672/,amqps://b:5671/"},
		// The source derived from names that need escaping is one claim takes.
		"cloudevents, derived source": {"OUTBOX_MESSAGE_FORMAT": "cloudevents-structured",
			"OUTBOX_MONGO_DATABASE": "my shop", "OUTBOX_MONGO_COLLECTION": "out?box#1"},
		"cloudevents, a source": {"OUTBOX_MESSAGE_FORMAT": "cloudevents-binary", "OUTBOX_CLOUDEVENTS_SOURCE": "urn:shop:orders"},
	}
	for name, env := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env["OUTBOX_HTTP_ADDR"] = "127.0.0.1:0"
			cfg, _, err := loadConfig("run", nil, envOf(env), relayCommand, nil)
			if err != nil {
				t.Fatalf("loadConfig: %v", err)
			}
			w, err := newWorker(cfg, slog.New(slog.DiscardHandler), nil)
			if err != nil {
				t.Fatalf("newWorker refused a Config loadConfig accepted: %v", err)
			}
			if err := w.disconnect(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestTracingOffByDefault: without OTEL_TRACES_EXPORTER, or with none,
// the worker's tracer provider is the no-op one; OUTBOX_TRACE_MONGO then
// does nothing, and the worker says so.
func TestTracingOffByDefault(t *testing.T) {
	t.Parallel()
	for name, env := range map[string]map[string]string{
		"unset": {},
		"none":  {"OTEL_TRACES_EXPORTER": "none"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env["OUTBOX_HTTP_ADDR"] = "127.0.0.1:0"
			env["OUTBOX_TRACE_MONGO"] = "true"
			cfg, _, err := loadConfig("run", nil, envOf(env), relayCommand, nil)
			if err != nil {
				t.Fatal(err)
			}
			tracer, err := telemetry.New(t.Context(), cfg.Tracing, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			var logs strings.Builder
			w, err := newWorker(cfg, slog.New(slog.NewTextHandler(&logs, nil)), tracer)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = w.disconnect(context.WithoutCancel(t.Context())) }()
			if w.tracer.Enabled() || tracingMode(cfg, w.tracer) != "off" {
				t.Errorf("tracing %q, want off", tracingMode(cfg, w.tracer))
			}
			if !strings.Contains(logs.String(), "OUTBOX_TRACE_MONGO has no effect") {
				t.Errorf("no warning that OUTBOX_TRACE_MONGO does nothing with tracing off; log:\n%s", logs.String())
			}
		})
	}
}
