package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxrelay/outbox/claim"
	"github.com/outboxrelay/outbox/fleet"
)

// writeFleet writes a fleet file and returns its path.
func writeFleet(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestFleetFileSetsEachOutbox(t *testing.T) {
	t.Parallel()
	path := writeFleet(t, `
outboxes:
  - name: orders
    database: shop
    collection: outbox
    exchange: orders
    batch_size: 50
    ordering: none
    retention: 1h
  - name: billing
    mongo_uri: mongodb://billing-db:27017
    database: billing
    collection: outbox
    exchange: billing
    message_format: cloudevents-binary
`)
	env := map[string]string{"OUTBOX_FLEET_FILE": path, "OUTBOX_BATCH_SIZE": "300", "OUTBOX_MONGO_URI": "mongodb://main-db:27017"}
	cfg, _, err := loadConfig("run", nil, envOf(env), relayCommand, nil)
	if err != nil {
		t.Fatalf("loadConfig: %v", err)
	}
	base := defaultConfig()
	base.MongoURI, base.BatchSize, base.FleetFile = "mongodb://main-db:27017", 300, path
	base.CloudEventsSource = ""
	base.ClaimIdleMax = claim.IdleMaxDefault // auto, in a fleet
	orders := base
	orders.MongoDatabase, orders.MongoCollection, orders.AMQPExchange = "shop", "outbox", "orders"
	orders.BatchSize, orders.Ordering, orders.Retention = 50, claim.OrderingNone, time.Hour
	orders.CloudEventsSource = "/outbox/shop/outbox" // derived from its own database and collection
	billing := base
	billing.MongoURI, billing.MongoDatabase, billing.MongoCollection, billing.AMQPExchange = "mongodb://billing-db:27017", "billing", "outbox", "billing"
	billing.MessageFormat, billing.CloudEventsSource = "cloudevents-binary", "/outbox/billing/outbox"
	// Both may have a batch in flight: the auto bound is shared.
	orders.BatchBytes, billing.BatchBytes = base.BatchBytes/2, base.BatchBytes/2
	want := []outboxConfig{{Name: "orders", Config: orders}, {Name: "billing", Config: billing}}
	got, _ := expandOutboxes(cfg.Outboxes, nil)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Outboxes (-want +got):\n%s", diff)
	}
}

func TestFleetFileErrorsNameTheOutboxAndTheField(t *testing.T) {
	t.Parallel()
	const head = "outboxes:\n  - name: a\n    database: d\n    collection: c\n    exchange: e\n"
	for _, tc := range []struct{ name, text, want string }{
		{"bad value", head + "    batch_size: 0\n", `line 2: outbox "a": batch_size "0": want 1 to 10000`},
		{"bad schedule", head + "    claim_schedule: often\n", `outbox "a": claim_schedule "often": want a cron schedule`},
		{"bad uri, password hidden", head + "    mongo_uri: http://u:secret@x\n", `outbox "a": mongo_uri "http://u:xxxxx@x"`},
		{"unknown field", head + "    bach_size: 3\n", "field bach_size not found"},
		{"bad name", strings.Replace(head, "name: a", "name: A", 1), `outbox "A": name: "A": want lower-case`},
		{"one collection twice", head + "  - name: b\n    database: d\n    collection: c\n    exchange: f\n", `outbox "b": collection "c": outbox "a" relays it already`},
		{"a side collection", head + "  - name: b\n    database: d\n    collection: c_owners\n    exchange: f\n", `outbox "b": collection "c_owners" is where the worker keeps outbox "a"'s owners`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := writeFleet(t, tc.text)
			_, _, err := loadConfig("run", nil, envOf(map[string]string{"OUTBOX_FLEET_FILE": path}), relayCommand, nil)
			if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
				t.Errorf("loadConfig = %v, want a usage error naming %s and %q", err, path, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), "secret") {
				t.Errorf("loadConfig = %v: shows a password", err)
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		t.Parallel()
		_, _, err := loadConfig("run", nil, envOf(map[string]string{"OUTBOX_FLEET_FILE": "/nonexistent/fleet.yaml"}), relayCommand, nil)
		if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "OUTBOX_FLEET_FILE") {
			t.Errorf("loadConfig = %v, want a usage error naming OUTBOX_FLEET_FILE", err)
		}
	})
}

// TestFleetFieldsAreSettings guards the map from the file's fields to the
// settings: a field the worker did not map would be accepted and ignored.
func TestFleetFieldsAreSettings(t *testing.T) {
	t.Parallel()
	var envs []string
	for _, s := range settings() {
		envs = append(envs, s.env)
	}
	for _, f := range fleet.Fields() {
		env, ok := fleetFieldSettings[f]
		if !ok || !slices.Contains(envs, env) {
			t.Errorf("fleet field %s sets %q, which is no setting", f, env)
		}
	}
	if len(fleetFieldSettings) != len(fleet.Fields()) {
		t.Errorf("fleetFieldSettings maps %d fields, the file has %d", len(fleetFieldSettings), len(fleet.Fields()))
	}
}

// TestOperatorCommandsTakeAnOutbox: with a fleet file, an operator
// command acts on the outbox --outbox names, with that outbox's
// database, collection and ordering; it refuses to guess among several
// and names them; without a file the one outbox is default.
func TestOperatorCommandsTakeAnOutbox(t *testing.T) {
	t.Parallel()
	path := writeFleet(t, `
outboxes:
  - name: orders
    database: shop
    collection: outbox
    exchange: orders
  - name: billing
    mongo_uri: mongodb://billing-db:27017
    database: billing
    collection: events
    exchange: billing
    ordering_after_failed: continue
`)
	env := envOf(map[string]string{"OUTBOX_FLEET_FILE": path})
	cfg, _, err := loadConfig("stats", []string{"--outbox", "billing"}, env, operatorCommand, nil)
	if err != nil {
		t.Fatalf("loadConfig --outbox billing: %v", err)
	}
	if cfg.MongoURI != "mongodb://billing-db:27017" || cfg.MongoDatabase != "billing" || cfg.MongoCollection != "events" || cfg.OrderingAfterFailed != "continue" {
		t.Errorf("--outbox billing: uri %q, database %q, collection %q, after failed %q; want billing's", cfg.MongoURI, cfg.MongoDatabase, cfg.MongoCollection, cfg.OrderingAfterFailed)
	}
	for _, tc := range []struct {
		name string
		args []string
		env  func(string) string
		want string
	}{
		{"no name among several", nil, env, "lists 2 outboxes (orders, billing): name one with --outbox"},
		{"an unknown name", []string{"--outbox", "biling"}, env, `--outbox "biling"`},
		{"a name without a file", []string{"--outbox", "orders"}, envOf(nil), "OUTBOX_FLEET_FILE is unset"},
	} {
		_, _, err := loadConfig("stats", tc.args, tc.env, operatorCommand, nil)
		if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: loadConfig = %v, want a usage error saying %q", tc.name, err, tc.want)
		}
	}
	if _, _, err := loadConfig("stats", []string{"--outbox", "default"}, envOf(nil), operatorCommand, nil); err != nil {
		t.Errorf("--outbox default without a file: %v, want the one outbox", err)
	}
	one := writeFleet(t, "outboxes:\n  - name: solo\n    database: d\n    collection: c\n    exchange: e\n")
	cfg, _, err = loadConfig("setup", nil, envOf(map[string]string{"OUTBOX_FLEET_FILE": one}), operatorCommand, nil)
	if err != nil || cfg.MongoDatabase != "d" || cfg.MongoCollection != "c" {
		t.Errorf("a file of one outbox without --outbox: database %q, collection %q, error %v; want that outbox", cfg.MongoDatabase, cfg.MongoCollection, err)
	}
}

// TestConsoleServesEveryOutbox: worker console without --outbox serves
// every outbox of the file, each with its own database settings and
// named for its audit; with --outbox, that one; without a file, the one
// outbox unnamed, as before fleets.
func TestConsoleServesEveryOutbox(t *testing.T) {
	t.Parallel()
	path := writeFleet(t, `
outboxes:
  - name: orders
    database: shop
    collection: outbox
    exchange: orders
  - name: billing
    mongo_uri: mongodb://billing-db:27017
    database: billing
    collection: events
    exchange: billing
`)
	env := envOf(map[string]string{"OUTBOX_FLEET_FILE": path})
	where := func(cfg Config) []string {
		var got []string
		for _, o := range cfg.Outboxes {
			got = append(got, fmt.Sprintf("%s=%s/%s/%s (%s)", o.Name, o.MongoURI, o.MongoDatabase, o.MongoCollection, o.Outbox))
		}
		return got
	}
	def := settingDefault(t, "OUTBOX_MONGO_URI")
	for _, tc := range []struct {
		args []string
		env  func(string) string
		want []string
	}{
		{nil, env, []string{"orders=" + def + "/shop/outbox (orders)", "billing=mongodb://billing-db:27017/billing/events (billing)"}},
		{[]string{"--outbox", "billing"}, env, []string{"billing=mongodb://billing-db:27017/billing/events (billing)"}},
		{nil, envOf(nil), []string{"=" + def + "/outbox/events ()"}},
	} {
		cfg, _, err := loadConfig("console", tc.args, tc.env, consoleKind, nil)
		if err != nil {
			t.Fatalf("console %q: %v", tc.args, err)
		}
		if diff := cmp.Diff(tc.want, where(cfg)); diff != "" {
			t.Errorf("console %q serves (-want +got):\n%s", tc.args, diff)
		}
	}
}

// TestConsoleLeavesOutPatterns: an entry of a pattern of databases has
// no database before the cluster is listed; the console serves the other
// outboxes, opens a tenant by --outbox <entry>/<database>, and refuses a
// file of patterns alone, saying how to open one.
func TestConsoleLeavesOutPatterns(t *testing.T) {
	t.Parallel()
	mixed := writeFleet(t, `
outboxes:
  - name: orders
    database: shop
    collection: outbox
    exchange: orders
  - name: tenants
    databases: "tenant_*"
    collection: outbox
    exchange: tenants
`)
	cfg, _, err := loadConfig("console", nil, envOf(map[string]string{"OUTBOX_FLEET_FILE": mixed}), consoleKind, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := outboxNames(cfg.Outboxes); !slices.Equal(got, []string{"orders"}) {
		t.Errorf("console serves %v, want [orders]", got)
	}
	cfg, _, err = loadConfig("console", []string{"--outbox", "tenants/tenant_a"}, envOf(map[string]string{"OUTBOX_FLEET_FILE": mixed}), consoleKind, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Outboxes) != 1 || cfg.Outboxes[0].Name != "tenants/tenant_a" || cfg.Outboxes[0].MongoDatabase != "tenant_a" {
		t.Errorf("console --outbox tenants/tenant_a serves %+v, want tenants/tenant_a on database tenant_a", cfg.Outboxes)
	}
	only := writeFleet(t, "outboxes:\n  - name: tenants\n    databases: \"tenant_*\"\n    collection: outbox\n    exchange: t\n")
	_, _, err = loadConfig("console", nil, envOf(map[string]string{"OUTBOX_FLEET_FILE": only}), consoleKind, nil)
	if err == nil || !strings.Contains(err.Error(), "--outbox <outbox>/<database>") {
		t.Errorf("console of patterns alone: %v, want a refusal saying to open one with --outbox <outbox>/<database>", err)
	}
}

// settingDefault is the default of the setting env.
func settingDefault(t *testing.T, env string) string {
	t.Helper()
	for _, s := range settings() {
		if s.env == env {
			return s.def
		}
	}
	t.Fatalf("no setting %s", env)
	return ""
}

// TestSameOutboxIgnoresTheSharedBatchBound: adding an outbox to the file
// changes every outbox's share of the auto batch bound; a reload must not
// restart them for that, but does for a setting of their own.
func TestSameOutboxIgnoresTheSharedBatchBound(t *testing.T) {
	t.Parallel()
	a := outboxConfig{Name: "a", Config: Config{BatchBytesAuto: true, BatchBytes: 32 << 20, BatchSize: 500}}
	b := a
	b.BatchBytes = 16 << 20
	if !sameOutbox(a, b) {
		t.Error("an outbox whose auto batch bound's share changed is restarted, want it kept")
	}
	b.BatchSize = 100
	if sameOutbox(a, b) {
		t.Error("an outbox whose batch size changed is kept, want it restarted")
	}
	c := a
	c.BatchBytesAuto, c.BatchBytes = false, 16<<20
	if sameOutbox(a, c) {
		t.Error("an outbox whose batch bound was set is kept, want it restarted")
	}
}
