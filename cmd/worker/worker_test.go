package main

import (
	"context"
	"log/slog"
	"strconv"
	"testing"

	"github.com/outboxrelay/outbox/claim"
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
			w, err := newWorker(cfg, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatalf("newWorker refused a Config loadConfig accepted: %v", err)
			}
			if err := w.client.Disconnect(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
}
