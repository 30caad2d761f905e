package main

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// loadSpec loads a fleet file of text with the default settings.
func loadSpec(t *testing.T, text string) []outboxConfig {
	t.Helper()
	cfg, _, err := loadConfig("run", nil, envOf(map[string]string{"OUTBOX_FLEET_FILE": writeFleet(t, text)}), relayCommand, nil)
	if err != nil {
		t.Fatalf("loadConfig: %v", err)
	}
	return cfg.Outboxes
}

const tenantsFile = `
outboxes:
  - name: main
    database: tenant_main
    collection: outbox
    exchange: main
  - name: tenants
    databases: tenant_*
    collection: outbox
    exchange: tenants
    batch_size: 50
`

func TestExpandOutboxesRelaysEachMatchingDatabase(t *testing.T) {
	t.Parallel()
	spec := loadSpec(t, tenantsFile)
	if !spec[1].template() || spec[1].MongoDatabase != "" {
		t.Fatalf("the entry of a pattern loaded as %+v, want a template without a database", spec[1])
	}
	uri := spec[1].MongoURI
	got, skipped := expandOutboxes(spec, map[string]found{"tenants": {uri: uri, databases: []string{
		"tenant_b", "admin", "shop", "tenant_a", "tenant_C", "tenant_main",
	}}})
	var names []string
	for _, oc := range got {
		names = append(names, oc.Name)
	}
	if diff := cmp.Diff([]string{"main", "tenants/tenant_a", "tenants/tenant_b"}, names); diff != "" {
		t.Errorf("outboxes (-want +got):\n%s", diff)
	}
	a := got[1]
	if a.MongoDatabase != "tenant_a" || a.BatchSize != 50 || a.AMQPExchange != "tenants" || a.CloudEventsSource != "/outbox/tenant_a/outbox" || a.template() {
		t.Errorf("tenants/tenant_a = %+v, want the entry's settings in database tenant_a, its source its own", a)
	}
	if a.BatchBytes != got[0].BatchBytes || a.BatchBytes >= spec[0].BatchBytes {
		t.Errorf("auto batch bytes %d and %d of %d, want an equal share", got[0].BatchBytes, a.BatchBytes, spec[0].BatchBytes)
	}
	var why []string
	for _, s := range skipped {
		why = append(why, s.database+": "+s.why)
	}
	if len(skipped) != 2 || !strings.Contains(why[0], "tenant_C: database \"tenant_C\" cannot name an outbox") ||
		!strings.Contains(why[1], `tenant_main: outbox "tenants/tenant_main": collection "outbox": outbox "main" relays it already`) {
		t.Errorf("skipped %q, want tenant_C (its name) and tenant_main (relayed by main)", why)
	}
}

func TestExpandOutboxesWaitsForAListingOfAChangedCluster(t *testing.T) {
	t.Parallel()
	spec := loadSpec(t, tenantsFile)
	got, _ := expandOutboxes(spec, map[string]found{"tenants": {uri: "mongodb://elsewhere:27017", databases: []string{"tenant_a"}}})
	if len(got) != 1 || got[0].Name != "main" {
		t.Errorf("outboxes %v, want main alone: what was listed on another cluster is not this entry's", outboxNames(got))
	}
}

func TestListFilter(t *testing.T) {
	t.Parallel()
	for pattern, want := range map[string]bson.D{
		"tenant_*": {{Key: "name", Value: bson.D{{Key: "$regex", Value: "^tenant_"}}}},
		"t.x?":     {{Key: "name", Value: bson.D{{Key: "$regex", Value: `^t\.x`}}}},
		"*_tenant": {},
		"[ab]*":    {},
		"shop":     {{Key: "name", Value: bson.D{{Key: "$regex", Value: "^shop"}}}},
		`a\*b`:     {{Key: "name", Value: bson.D{{Key: "$regex", Value: "^a"}}}},
	} {
		if diff := cmp.Diff(want, listFilter(pattern)); diff != "" {
			t.Errorf("listFilter(%q) (-want +got):\n%s", pattern, diff)
		}
	}
}

func TestDiffOutboxes(t *testing.T) {
	t.Parallel()
	oc := func(name string, batch int) outboxConfig {
		return outboxConfig{Name: name, Config: Config{BatchSize: batch, MongoDatabase: name}}
	}
	running := []*relayedOutbox{
		{name: "t/a", oc: oc("t/a", 10)}, {name: "t/b", oc: oc("t/b", 10)}, {name: "t/c", oc: oc("t/c", 10)},
	}
	d := diffOutboxes(running, []outboxConfig{oc("t/a", 10), oc("t/c", 20), oc("t/d", 10)})
	got := map[string][]string{"added": d.added, "removed": d.removed, "changed": d.changed}
	want := map[string][]string{"added": {"t/d"}, "removed": {"t/b"}, "changed": {"t/c"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("diff (-want +got):\n%s", diff)
	}
	if len(d.stopping) != 2 || d.stopping[0] != running[2] || d.stopping[1] != running[1] {
		t.Errorf("stopping %v, want t/c (changed) and t/b (removed)", d.stopping)
	}
	if len(d.starting) != 2 || d.starting[0].Name != "t/c" || d.starting[1].Name != "t/d" {
		t.Errorf("starting %v, want t/c with its new settings and t/d", outboxNames(d.starting))
	}
	if d := diffOutboxes(running, []outboxConfig{oc("t/a", 10), oc("t/b", 10), oc("t/c", 10)}); len(d.stopping)+len(d.starting) != 0 {
		t.Errorf("the same outboxes: %+v, want no change", d)
	}
}

func TestDiscoveryIntervalIsChecked(t *testing.T) {
	t.Parallel()
	_, _, err := loadConfig("run", nil, envOf(map[string]string{"OUTBOX_FLEET_DISCOVERY_INTERVAL": "500ms"}), relayCommand, nil)
	if err == nil || !strings.Contains(err.Error(), `invalid OUTBOX_FLEET_DISCOVERY_INTERVAL "500ms"`) {
		t.Errorf("loadConfig = %v, want an error naming OUTBOX_FLEET_DISCOVERY_INTERVAL and its value", err)
	}
	cfg, _, err := loadConfig("run", nil, envOf(map[string]string{"OUTBOX_FLEET_DISCOVERY_INTERVAL": "5s"}), relayCommand, nil)
	if err != nil || cfg.DiscoveryInterval != 5*time.Second {
		t.Errorf("loadConfig = %v, %v; want an interval of 5s", cfg.DiscoveryInterval, err)
	}
}

// A listing that fails keeps the outboxes found before; the next one that
// succeeds is what counts, and a database gone from it is let go.
func TestDiscoverKeepsWhatItFoundWhileListingFails(t *testing.T) {
	t.Parallel()
	spec := loadSpec(t, tenantsFile)
	var listed []string
	var listErr error
	w := &worker{cfg: Config{FleetFile: "fleet.yaml"}, logger: slog.New(slog.DiscardHandler), spec: spec, discovery: newDiscovery()}
	w.discovery.list = func(context.Context, outboxConfig) ([]string, error) { return listed, listErr }
	names := func() string { return strings.Join(outboxNames(w.discover(t.Context())), ",") }

	listed = []string{"tenant_a", "tenant_b"}
	if got := names(); got != "main,tenants/tenant_a,tenants/tenant_b" {
		t.Errorf("first listing: %s", got)
	}
	listed, listErr = nil, errors.New("server selection timeout")
	if got := names(); got != "main,tenants/tenant_a,tenants/tenant_b" {
		t.Errorf("while the listing fails: %s, want what was found before", got)
	}
	if !w.discovery.failing["tenants"] {
		t.Error("a failing listing is not noted")
	}
	listed, listErr = []string{"tenant_b", "tenant_c"}, nil
	if got := names(); got != "main,tenants/tenant_b,tenants/tenant_c" {
		t.Errorf("once the listing works again: %s, want a let go and c found", got)
	}
	if w.discovery.failing["tenants"] {
		t.Error("a listing that works again is still noted as failing")
	}
}

// --outbox <entry>/<database> names a discovered outbox to the operator
// commands: the entry's settings in that database, if its pattern matches.
func TestOutboxFlagNamesADiscoveredOutbox(t *testing.T) {
	t.Parallel()
	env := envOf(map[string]string{"OUTBOX_FLEET_FILE": writeFleet(t, tenantsFile)})
	cfg, _, err := loadConfig("stats", []string{"--outbox", "tenants/tenant_x"}, env, operatorCommand, nil)
	if err != nil || cfg.MongoDatabase != "tenant_x" || cfg.MongoCollection != "outbox" {
		t.Errorf("--outbox tenants/tenant_x: database %q, collection %q, %v; want tenant_x.outbox", cfg.MongoDatabase, cfg.MongoCollection, err)
	}
	for name, want := range map[string]string{
		"tenants/shop":     `database "shop" does not match outbox "tenants"'s pattern "tenant_*"`,
		"main/tenant_x":    `outbox "main" of OUTBOX_FLEET_FILE`,
		"billing/tenant_x": `lists no outbox "billing"`,
	} {
		if _, _, err := loadConfig("stats", []string{"--outbox", name}, env, operatorCommand, nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--outbox %s: %v, want an error saying %s", name, err, want)
		}
	}
}
