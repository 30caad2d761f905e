package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/internal/workerproc"
	"github.com/outboxrelay/outbox/mongo"
)

// TestRequeueIDsFrom requeues events whose ids the comma form of --id
// cannot name (a comma, spaces), read one per line from standard input and
// from a file.
func TestRequeueIDsFrom(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	now := time.Now().UTC()
	ids := []string{"order,1", " padded ", "tab\there", "plain", "left alone", "from,file"}
	var docs []any
	for _, id := range ids {
		docs = append(docs, draftDoc(t, events.Draft{ID: id, Type: "t", Payload: bson.D{{Key: "n", Value: 1}}}, now,
			bson.E{Key: events.FieldStatus, Value: events.StatusFailed}))
	}
	coll, env := toolsOutbox(ctx, t, testenv.MongoURI(t), testenv.Database(t), docs)

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
	out = runTool(ctx, t, env, 0, "requeue", "--ids-from", path)
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
	runTool(ctx, t, env, 2, "requeue", "--ids-from", filepath.Join(t.TempDir(), "missing"))
}

// runToolStdin runs the worker binary with args and input on its standard
// input, and returns its stdout, failing the test unless it exits with
// wantCode.
func runToolStdin(ctx context.Context, t *testing.T, env map[string]string, input string, wantCode int, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, workerBinary(t), args...)
	cmd.Env = workerproc.Environ(env)
	cmd.Stdin = strings.NewReader(input)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("worker %s: %v", strings.Join(args, " "), err)
	}
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
	now := time.Now().UTC()
	var docs []any
	for id, status := range map[string]events.Status{"bad-1": events.StatusFailed, "new-1": events.StatusNew} {
		d := events.Draft{ID: id, Type: "t", AggregateType: "order", AggregateID: "7", Payload: bson.D{{Key: "n", Value: 1}}}
		docs = append(docs, draftDoc(t, d, now, bson.E{Key: events.FieldStatus, Value: status}))
	}
	coll, env := toolsOutbox(ctx, t, testenv.MongoURI(t), testenv.Database(t), docs)

	runTool(ctx, t, env, 2, "skip", "--id", "bad-1", "--reason", "compensated")
	runTool(ctx, t, env, 2, "skip", "--id", "bad-1", "--by", "alice")
	if out := runTool(ctx, t, env, 0, "skip", "--id", "bad-1,new-1", "--by", "alice", "--reason", "compensated", "--dry-run"); out != "1 FAILED events would be skipped\n" {
		t.Errorf("dry run printed %q", out)
	}
	out := runTool(ctx, t, env, 0, "skip", "--id", "bad-1", "--id", "new-1", "--by", "alice", "--reason", "compensated by hand")
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

// TestDiscard marks a FAILED event discarded, and skipped, with who and
// why; a requeue naming it leaves it so; it leaves an event that is not
// FAILED alone, refuses to run without --by or --reason, and is audited.
func TestDiscard(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	now := time.Now().UTC()
	var docs []any
	for id, status := range map[string]events.Status{"bad-1": events.StatusFailed, "new-1": events.StatusNew} {
		d := events.Draft{ID: id, Type: "t", AggregateType: "order", AggregateID: "7", Payload: bson.D{{Key: "n", Value: 1}}}
		docs = append(docs, draftDoc(t, d, now, bson.E{Key: events.FieldStatus, Value: status}))
	}
	db := testenv.Database(t)
	coll, env := toolsOutbox(ctx, t, testenv.MongoURI(t), db, docs)

	runTool(ctx, t, env, 2, "discard", "--id", "bad-1", "--reason", "duplicate")
	runTool(ctx, t, env, 2, "discard", "--id", "bad-1", "--by", "alice")
	if out := runTool(ctx, t, env, 0, "discard", "--id", "bad-1,new-1", "--by", "alice", "--reason", "duplicate", "--dry-run"); out != "1 FAILED events would be discarded\n" {
		t.Errorf("dry run printed %q", out)
	}
	out := runTool(ctx, t, env, 0, "discard", "--id", "bad-1", "--id", "new-1", "--by", "alice", "--reason", "a duplicate of order 7's")
	if !strings.HasPrefix(out, "discarded 1 FAILED events") {
		t.Errorf("discard printed %q", out)
	}
	runTool(ctx, t, env, 0, "requeue", "--id", "bad-1", "--by", "bo", "--reason", "try again")
	var got []events.Event
	cur, err := coll.Find(ctx, bson.D{})
	if err != nil || cur.All(ctx, &got) != nil {
		t.Fatalf("find: %v", err)
	}
	for _, e := range got {
		switch e.ID {
		case "bad-1":
			if e.Status != events.StatusFailed || e.DiscardedBy != "alice" || e.DiscardReason != "a duplicate of order 7's" || e.DiscardedAt.IsZero() || e.SkippedAt.IsZero() {
				t.Errorf("discarded event: %s by %q because %q at %s, skipped at %s; want FAILED, alice, the reason, a time, skipped",
					e.Status, e.DiscardedBy, e.DiscardReason, e.DiscardedAt, e.SkippedAt)
			}
		case "new-1":
			if e.Status != events.StatusNew || e.DiscardedBy != "" {
				t.Errorf("NEW event after discard: %s discarded by %q; want untouched", e.Status, e.DiscardedBy)
			}
		}
	}
	actions, err := mongo.New(db.Client(), mongo.Config{Database: db.Name(), Collection: coll.Name()}).Actions(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(actions) != 2 || actions[1].Name != "discard" || actions[1].By != "alice" || actions[1].Count != 1 || actions[1].Source != "cli" ||
		actions[0].Name != "requeue" || actions[0].Count != 0 {
		t.Errorf("audit = %+v; want alice's discard of 1, then bo's requeue of 0", actions)
	}
}

// toolsScenario: stats, requeue and show against a prepared outbox.
func toolsScenario(t *testing.T, s stack) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	now := time.Now().UTC().Truncate(time.Millisecond)

	doc := func(id any, typ string, status events.Status, extra ...bson.E) any {
		d := events.Draft{ID: id, Type: typ, Payload: bson.D{{Key: "n", Value: 1}}}
		return draftDoc(t, d, now.Add(-10*time.Minute), append([]bson.E{{Key: events.FieldStatus, Value: status}}, extra...)...)
	}
	failed := func(id any, typ string) any {
		return doc(id, typ, events.StatusFailed,
			bson.E{Key: events.FieldAttempts, Value: 10},
			bson.E{Key: events.FieldLastError, Value: "nacked by the broker"},
			bson.E{Key: events.FieldFailedAt, Value: now.Add(-time.Minute)})
	}
	paymentID := bson.NewObjectID()
	docs := []any{
		failed(nil, "order.created"),
		failed(nil, "order.created"),
		failed(nil, "order.created"),
		failed(paymentID, "payment.captured"),
		failed("payment-2", "payment.captured"),
		doc(nil, "order.created", events.StatusNew, bson.E{Key: events.FieldCreatedAt, Value: now.Add(-time.Hour)}),
		doc(nil, "order.created", events.StatusNew),
		doc(nil, "order.created", events.StatusProcessing,
			bson.E{Key: events.FieldWorkerID, Value: "gone-1"},
			bson.E{Key: events.FieldProcessingAt, Value: now.Add(-2 * time.Hour)}),
		doc(nil, "order.created", events.StatusProcessing,
			bson.E{Key: events.FieldWorkerID, Value: "busy-1"},
			bson.E{Key: events.FieldProcessingAt, Value: now}),
		doc(nil, "order.created", events.StatusPublished, bson.E{Key: events.FieldPublishedAt, Value: now}),
		// Backing off until next year: only requeue --id makes it due.
		doc("retry-later", "order.created", events.StatusNew,
			bson.E{Key: events.FieldAttempts, Value: 2},
			bson.E{Key: events.FieldRetryAt, Value: now.AddDate(1, 0, 0)}),
	}
	coll, env := toolsOutbox(ctx, t, s.mongoURI, s.database(t), docs)

	t.Run("stats json", func(t *testing.T) {
		out := runTool(ctx, t, env, 0, "stats", "--json")
		var got struct {
			Counts              map[string]int64 `json:"counts"`
			OldestNewAgeSeconds float64          `json:"oldestNewAgeSeconds"`
			StaleProcessing     int64            `json:"staleProcessing"`
			StaleAfterSeconds   float64          `json:"staleAfterSeconds"`
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("stats --json output is not JSON: %v\n%s", err, out)
		}
		want := map[string]int64{"NEW": 3, "PROCESSING": 2, "PUBLISHED": 1, "FAILED": 5, "unknown": 0}
		if diff := cmp.Diff(want, got.Counts); diff != "" {
			t.Errorf("counts (-want +got):\n%s", diff)
		}
		if got.StaleProcessing != 1 || got.StaleAfterSeconds != 60 {
			t.Errorf("stale = %d after %gs, want 1 after 60s", got.StaleProcessing, got.StaleAfterSeconds)
		}
		if age := got.OldestNewAgeSeconds; age < 3600 || age > 3600+120 {
			t.Errorf("oldest NEW age = %gs, want about 3600s", age)
		}
	})
	t.Run("stats table", func(t *testing.T) {
		out := runTool(ctx, t, env, 0, "stats")
		for _, re := range []string{`(?m)^NEW\s+3$`, `(?m)^PROCESSING\s+2$`, `(?m)^PUBLISHED\s+1$`, `(?m)^FAILED\s+5$`, `(?m)^unknown\s+0$`,
			`(?m)^oldest NEW event\s+1h0m\d+(\.\d+)?s old$`, `(?m)^stale PROCESSING \(older than 1m0s\)\s+1$`} {
			if !regexp.MustCompile(re).MatchString(out) {
				t.Errorf("stats output does not match %s:\n%s", re, out)
			}
		}
	})
	// In order: each requeue sees what the one before left.
	for _, step := range []struct {
		name   string
		args   []string
		want   string
		failed int64 // FAILED events after the step
	}{
		{"requeue dry run", []string{"requeue", "--type", "order.created", "--dry-run"}, "3 FAILED events would be requeued\n", 5},
		{"requeue by id", []string{"requeue", "--id", paymentID.Hex()}, "requeued 1 FAILED events to NEW\n", 4},
		{"requeue by string id", []string{"requeue", "--id", "payment-2"}, "requeued 1 FAILED events to NEW\n", 3},
		{"requeue backing off, dry run", []string{"requeue", "--id", "retry-later", "--dry-run"},
			"0 FAILED events would be requeued\n1 NEW events backing off would be retried now\n", 3},
		{"requeue backing off", []string{"requeue", "--id", "retry-later"},
			"requeued 0 FAILED events to NEW\n1 NEW events backing off are due now (retryAt cleared)\n", 3},
	} {
		t.Run(step.name, func(t *testing.T) {
			command := strings.Join(step.args, " ")
			if out := runTool(ctx, t, env, 0, step.args...); out != step.want {
				t.Errorf("worker %s printed %q, want %q", command, out, step.want)
			}
			if c := countOf(ctx, t, coll, events.StatusFailed); c != step.failed {
				t.Errorf("FAILED after worker %s = %d, want %d", command, c, step.failed)
			}
		})
	}
	t.Run("show", func(t *testing.T) {
		out := runTool(ctx, t, env, 0, "show", "--id", paymentID.Hex())
		var got struct {
			ID        bson.ObjectID `bson:"_id"`
			Type      string        `bson:"type"`
			Status    events.Status `bson:"status"`
			Attempts  int           `bson:"attempts"`
			LastError string        `bson:"lastError"`
			FailedAt  *time.Time    `bson:"failedAt"`
			Payload   bson.M        `bson:"payload"`
		}
		if err := bson.UnmarshalExtJSON([]byte(out), false, &got); err != nil {
			t.Fatalf("show output is not Extended JSON: %v\n%s", err, out)
		}
		// Requeued above: NEW with fresh attempts, lastError kept.
		if got.ID != paymentID || got.Type != "payment.captured" || got.Status != events.StatusNew ||
			got.Attempts != 0 || got.LastError != "nacked by the broker" || got.FailedAt != nil || got.Payload["n"] == nil {
			t.Errorf("show --id %s = %+v, want the requeued payment.captured event", paymentID.Hex(), got)
		}
	})
	t.Run("backing off made due", func(t *testing.T) {
		var got struct {
			Status   events.Status `bson:"status"`
			Attempts int           `bson:"attempts"`
			RetryAt  *time.Time    `bson:"retryAt"`
		}
		if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: "retry-later"}}).Decode(&got); err != nil {
			t.Fatal(err)
		}
		if got.Status != events.StatusNew || got.Attempts != 2 || got.RetryAt != nil {
			t.Errorf("retry-later after requeue --id = %+v, want NEW, attempts 2 kept, no retryAt", got)
		}
	})
	t.Run("show unknown id", func(t *testing.T) {
		runTool(ctx, t, env, 1, "show", "--id", bson.NewObjectID().Hex())
	})
	t.Run("requeue without filter", func(t *testing.T) {
		runTool(ctx, t, env, 2, "requeue")
	})
}

// runTool is runToolStdin with nothing on standard input.
func runTool(ctx context.Context, t *testing.T, env map[string]string, wantCode int, args ...string) string {
	t.Helper()
	return runToolStdin(ctx, t, env, "", wantCode, args...)
}

// toolsOutbox inserts docs in the outbox of db, a database of this test's
// own on the server at mongoURI, and returns the outbox and the
// environment that points the worker's tools at it.
func toolsOutbox(ctx context.Context, t *testing.T, mongoURI string, db *driver.Database, docs []any) (*driver.Collection, map[string]string) {
	t.Helper()
	coll := db.Collection(mongo.CollectionDefault)
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatalf("insert: %v", err)
	}
	return coll, map[string]string{"OUTBOX_MONGO_URI": mongoURI, "OUTBOX_MONGO_DATABASE": db.Name()}
}

// TestOperatorCommandsAreAudited: requeue and skip record who did what,
// why and to how many events, an action that changed nothing with a
// count of 0; a dry run records nothing.
func TestOperatorCommandsAreAudited(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	now := time.Now().UTC()
	var docs []any
	for _, id := range []string{"a", "b", "c"} {
		docs = append(docs, draftDoc(t, events.Draft{ID: id, Type: "t", Payload: bson.D{{Key: "n", Value: 1}}}, now,
			bson.E{Key: events.FieldStatus, Value: events.StatusFailed}))
	}
	db := testenv.Database(t)
	coll, env := toolsOutbox(ctx, t, testenv.MongoURI(t), db, docs)
	runTool(ctx, t, env, 0, "requeue", "--id", "a,b", "--dry-run")
	runTool(ctx, t, env, 0, "requeue", "--id", "a,b", "--by", "ana", "--reason", "broker fixed")
	runTool(ctx, t, env, 0, "requeue", "--id", "a") // now NEW: nothing changes
	runTool(ctx, t, env, 0, "skip", "--id", "c", "--by", "bo", "--reason", "obsolete")
	store := mongo.New(db.Client(), mongo.Config{Database: db.Name(), Collection: coll.Name()})
	got, err := store.Actions(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	type rec struct {
		name, by, reason, target, source string
		count                            int
	}
	var seen []rec
	for _, a := range got {
		seen = append(seen, rec{a.Name, a.By, a.Reason, a.Target, a.Source, a.Count})
	}
	want := []rec{
		{"skip", "bo", "obsolete", "ids: c", "cli", 1},
		{"requeue", whoRuns(), "", "ids: a", "cli", 0},
		{"requeue", "ana", "broker fixed", "ids: a, b", "cli", 2},
	}
	if diff := cmp.Diff(want, seen, cmp.AllowUnexported(rec{})); diff != "" {
		t.Errorf("audit records (-want +got):\n%s", diff)
	}
}
