package main

import (
	"bytes"
	"strings"
	"testing"

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
