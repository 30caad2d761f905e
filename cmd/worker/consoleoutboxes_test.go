package main

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestConsoleOutboxesWaitForTheirDatabase: of two outboxes, b's database
// behind a cut proxy, a is ready at once and b says its database is
// unreachable; once the proxy is restored b is ready, without a restart,
// and close stops what the openers started.
func TestConsoleOutboxesWaitForTheirDatabase(t *testing.T) {
	t.Parallel()
	uri := testenv.MongoURI(t)
	proxied, proxy := testenv.Proxied(t, uri)
	proxy.Cut()
	db := testenv.Database(t).Name()
	fleet := writeFleet(t, fmt.Sprintf("outboxes:\n"+
		"  - {name: a, mongo_uri: %q, database: %s, collection: outbox, exchange: ex}\n"+
		"  - {name: b, mongo_uri: %q, database: %s, collection: outbox, exchange: ex}\n", uri, db, proxied, db))
	cfg, _, err := loadConfig("console", nil, envOf(map[string]string{"OUTBOX_MONGO_URI": uri, "OUTBOX_FLEET_FILE": fleet}), consoleKind, nil)
	if err != nil {
		t.Fatal(err)
	}
	opened := newConsoleOutboxes()
	defer opened.close()
	for _, oc := range cfg.Outboxes {
		if err := opened.add(oc, slog.New(slog.DiscardHandler)); err != nil {
			t.Fatal(err)
		}
	}
	if len(opened.clusters) != 2 {
		t.Errorf("%d clusters for two MongoDB URIs, want 2, each with its own clock", len(opened.clusters))
	}
	a, b := opened.list[0], opened.list[1]
	if err := b.Ready(); err == nil {
		t.Error("b ready before its database was tried, want it not ready")
	}
	opened.start(t.Context())
	testenv.Eventually(t, time.Minute, func() (bool, string) {
		err := a.Ready()
		return err == nil, fmt.Sprintf("a ready: %v", err)
	})
	testenv.Eventually(t, time.Minute, func() (bool, string) {
		err := b.Ready()
		return err != nil && strings.Contains(err.Error(), "its database is unreachable"), fmt.Sprintf("b saying its database is unreachable: %v", err)
	})
	proxy.Restore()
	testenv.Eventually(t, 2*time.Minute, func() (bool, string) {
		err := b.Ready()
		return err == nil, fmt.Sprintf("b ready once its database answers: %v", err)
	})
}
