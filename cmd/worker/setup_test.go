package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// worker setup creates the schema and says what it did; run again it
// says there was nothing to do. A relay with OUTBOX_SETUP=check then
// starts on it.
func TestSetupCommand(t *testing.T) {
	t.Parallel()
	s := localStack(t)
	db := s.database(t)
	env := map[string]string{"OUTBOX_MONGO_URI": s.mongoURI, "OUTBOX_MONGO_DATABASE": db.Name()}
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), []string{"setup", "--console"}, envOf(env), nil, &stdout, &stderr); code != 0 {
		t.Fatalf("worker setup exited %d: %s", code, stderr.String())
	}
	for _, want := range []string{"created collection " + db.Name() + ".events", "created index outbox_claim_order", "created collection " + db.Name() + ".events_owners",
		"created the console's index outbox_browse"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("worker setup printed\n%s\nwhich lacks %q", stdout.String(), want)
		}
	}
	stdout.Reset()
	if code := run(t.Context(), []string{"setup", "--console"}, envOf(env), nil, &stdout, &stderr); code != 0 {
		t.Fatalf("worker setup again exited %d: %s", code, stderr.String())
	}
	if want := "nothing to do: every collection and index of " + db.Name() + ".events is in place\n"; stdout.String() != want {
		t.Errorf("worker setup again printed %q, want %q", stdout.String(), want)
	}
}

// With OUTBOX_SETUP=check, worker run on a database without the schema
// stops at start, exit code 1, naming what is missing and the command
// to run, and creates nothing.
func TestRunChecksTheSchema(t *testing.T) {
	t.Parallel()
	s := localStack(t)
	db := s.database(t)
	env := s.relayEnv(db.Name(), testenv.UniqueName(t, "ex_"), db.Name()+"-w")
	env["OUTBOX_SETUP"] = "check"
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), []string{"run"}, envOf(env), nil, &stdout, &stderr); code != 1 {
		t.Fatalf("worker run exited %d, want 1; stderr:\n%s", code, stderr.String())
	}
	for _, want := range []string{"the database lacks what the worker needs", "index outbox_claim {status: 1, createdAt: 1} on " + db.Name() + ".events",
		"collection " + db.Name() + ".events_owners", "Run `worker setup`"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("worker run's error lacks %q:\n%s", want, stderr.String())
		}
	}
	if names, err := db.ListCollectionNames(t.Context(), map[string]any{}); err != nil || len(names) != 0 {
		t.Errorf("worker run with OUTBOX_SETUP=check created %v (%v)", names, err)
	}
}

// tenantDatabases returns a pattern of database names of the test's own
// and the databases named by it, dropped at the end: each exists once a
// collection of it does (tenant creates one).
func tenantDatabases(t *testing.T, client *driver.Client) (pattern string, tenant func(suffix string) *driver.Database) {
	t.Helper()
	base := testenv.UniqueName(t, "t_")
	return base + "_*", func(suffix string) *driver.Database {
		t.Helper()
		db := client.Database(base + "_" + suffix)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 30*time.Second)
			defer cancel()
			_ = db.Drop(ctx)
		})
		if err := db.CreateCollection(t.Context(), "tenant"); err != nil {
			t.Fatal(err)
		}
		return db
	}
}

// With a fleet file and no --outbox, worker setup sets up every outbox
// of the file: an entry of one database, and the outbox of an entry of a
// pattern in each database that matches, not in one that does not.
func TestSetupCommandSetsUpTheFleet(t *testing.T) {
	t.Parallel()
	s := localStack(t)
	client := s.connect(t, testenv.ClientMaxPoolSize)
	single := uniqueDatabase(t, client)
	pattern, tenant := tenantDatabases(t, client)
	a, b := tenant("a"), tenant("b")
	other := uniqueDatabase(t, client)
	if err := other.CreateCollection(t.Context(), "tenant"); err != nil {
		t.Fatal(err)
	}
	path := writeFleet(t, "outboxes:\n"+
		"  - name: single\n    database: "+single.Name()+"\n    collection: events\n    exchange: x\n"+
		"  - name: tenants\n    databases: \""+pattern+"\"\n    collection: outbox\n    exchange: x\n")
	env := map[string]string{"OUTBOX_MONGO_URI": s.mongoURI, "OUTBOX_FLEET_FILE": path}
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), []string{"setup"}, envOf(env), nil, &stdout, &stderr); code != 0 {
		t.Fatalf("worker setup exited %d: %s", code, stderr.String())
	}
	for _, want := range []string{
		"outbox single (" + single.Name() + ".events):\ncreated collection " + single.Name() + ".events\n",
		"outbox tenants/" + a.Name() + " (" + a.Name() + ".outbox):\ncreated collection " + a.Name() + ".outbox\n",
		"outbox tenants/" + b.Name() + " (" + b.Name() + ".outbox):\ncreated collection " + b.Name() + ".outbox\n",
	} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("worker setup printed\n%s\nwhich lacks %q", stdout.String(), want)
		}
	}
	for _, db := range []*driver.Database{a, b} {
		names, err := db.ListCollectionNames(t.Context(), bson.D{})
		if err != nil || !slices.Contains(names, "outbox") || !slices.Contains(names, "outbox_owners") {
			t.Errorf("database %s holds %v after setup (%v), want outbox and outbox_owners", db.Name(), names, err)
		}
	}
	if names, err := other.ListCollectionNames(t.Context(), bson.D{}); err != nil || len(names) != 1 {
		t.Errorf("database %s, which the pattern does not match, holds %v after setup (%v), want its own collection alone", other.Name(), names, err)
	}
	// One outbox of the pattern, named as the relay names it.
	stdout.Reset()
	if code := run(t.Context(), []string{"setup", "--outbox", "tenants/" + a.Name()}, envOf(env), nil, &stdout, &stderr); code != 0 {
		t.Fatalf("worker setup --outbox exited %d: %s", code, stderr.String())
	}
	if want := "nothing to do: every collection and index of " + a.Name() + ".outbox is in place\n"; stdout.String() != want {
		t.Errorf("worker setup --outbox tenants/%s printed %q, want %q", a.Name(), stdout.String(), want)
	}
}
