package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
)

// TestRequeueIDsFrom requeues events whose ids the comma form of --id
// cannot name (a comma, spaces), read one per line from standard input and
// from a file.
func TestRequeueIDsFrom(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	db := testenv.Database(t)
	coll := db.Collection(mongo.CollectionDefault)
	now := time.Now().UTC()
	ids := []string{"order,1", " padded ", "tab\there", "plain", "left alone", "from,file"}
	var docs []any
	for _, id := range ids {
		d, err := events.Draft{ID: id, Type: "t", Payload: bson.D{{Key: "n", Value: 1}}}.Document(now)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, setFields(d, bson.E{Key: events.FieldStatus, Value: events.StatusFailed}))
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatalf("insert: %v", err)
	}
	env := map[string]string{"OUTBOX_MONGO_URI": testenv.MongoURI(t), "OUTBOX_MONGO_DATABASE": db.Name()}

	// CRLF endings, an empty line and a repeated id are all allowed.
	input := "order,1\r\n padded \n\ntab\there\nplain\norder,1\n"
	out := runToolStdin(ctx, t, env, input, 0, "requeue", "--ids-from", "-", "--dry-run")
	if want := "4 FAILED events would be requeued\n"; out != want {
		t.Errorf("dry run printed %q, want %q", out, want)
	}
	out = runToolStdin(ctx, t, env, input, 0, "requeue", "--ids-from", "-")
	if want := "requeued 4 FAILED events to NEW\n"; out != want {
		t.Errorf("requeue printed %q, want %q", out, want)
	}
	path := filepath.Join(t.TempDir(), "ids.txt")
	if err := os.WriteFile(path, []byte("from,file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out = runToolStdin(ctx, t, env, "", 0, "requeue", "--ids-from", path)
	if want := "requeued 1 FAILED events to NEW\n"; out != want {
		t.Errorf("requeue from a file printed %q, want %q", out, want)
	}

	var left []struct {
		ID string `bson:"_id"`
	}
	cur, err := coll.Find(ctx, bson.D{{Key: events.FieldStatus, Value: events.StatusFailed}})
	if err != nil || cur.All(ctx, &left) != nil {
		t.Fatalf("find FAILED: %v", err)
	}
	if diff := cmp.Diff([]struct {
		ID string `bson:"_id"`
	}{{ID: "left alone"}}, left); diff != "" {
		t.Errorf("FAILED events left (-want +got):\n%s", diff)
	}

	// Nothing to read is a usage error, as is a file that is not there.
	runToolStdin(ctx, t, env, "\n\n", 2, "requeue", "--ids-from", "-")
	runToolStdin(ctx, t, env, "", 2, "requeue", "--ids-from", filepath.Join(t.TempDir(), "missing"))
}

// runToolStdin runs the worker binary with args and input on its standard
// input, and returns its stdout, failing the test unless it exits with
// wantCode.
func runToolStdin(ctx context.Context, t *testing.T, env map[string]string, input string, wantCode int, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, workerBinary(t), args...)
	cmd.Env = processEnv(env)
	cmd.Stdin = strings.NewReader(input)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	_ = cmd.Run()
	if code := cmd.ProcessState.ExitCode(); code != wantCode {
		t.Errorf("worker %s exited with %d, want %d; stderr:\n%s", strings.Join(args, " "), code, wantCode, stderr.String())
	}
	return stdout.String()
}

// TestSkip marks a FAILED event skipped and records who and why; it
// leaves an event that is not FAILED alone, and refuses to run without
// --by or --reason.
func TestSkip(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	db := testenv.Database(t)
	coll := db.Collection(mongo.CollectionDefault)
	now := time.Now().UTC()
	var docs []any
	for id, status := range map[string]events.Status{"bad-1": events.StatusFailed, "new-1": events.StatusNew} {
		d, err := events.Draft{ID: id, Type: "t", AggregateType: "order", AggregateID: "7", Payload: bson.D{{Key: "n", Value: 1}}}.Document(now)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, setFields(d, bson.E{Key: events.FieldStatus, Value: status}))
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatalf("insert: %v", err)
	}
	env := map[string]string{"OUTBOX_MONGO_URI": testenv.MongoURI(t), "OUTBOX_MONGO_DATABASE": db.Name()}

	runToolStdin(ctx, t, env, "", 2, "skip", "--id", "bad-1", "--reason", "compensated")
	runToolStdin(ctx, t, env, "", 2, "skip", "--id", "bad-1", "--by", "alice")
	if out := runToolStdin(ctx, t, env, "", 0, "skip", "--id", "bad-1,new-1", "--by", "alice", "--reason", "compensated", "--dry-run"); out != "1 FAILED events would be skipped\n" {
		t.Errorf("dry run printed %q", out)
	}
	out := runToolStdin(ctx, t, env, "", 0, "skip", "--id", "bad-1", "--id", "new-1", "--by", "alice", "--reason", "compensated by hand")
	if !strings.HasPrefix(out, "skipped 1 FAILED events") {
		t.Errorf("skip printed %q", out)
	}
	var got []events.Event
	cur, err := coll.Find(ctx, bson.D{})
	if err != nil || cur.All(ctx, &got) != nil {
		t.Fatalf("find: %v", err)
	}
	for _, e := range got {
		switch e.ID {
		case "bad-1":
			if e.Status != events.StatusFailed || e.SkippedBy != "alice" || e.SkipReason != "compensated by hand" || e.SkippedAt.IsZero() {
				t.Errorf("skipped event: %s by %q because %q at %s; want FAILED, alice, the reason, a time", e.Status, e.SkippedBy, e.SkipReason, e.SkippedAt)
			}
		case "new-1":
			if e.Status != events.StatusNew || e.SkippedBy != "" {
				t.Errorf("NEW event after skip: %s skipped by %q; want untouched", e.Status, e.SkippedBy)
			}
		}
	}
}
