package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/console"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/internal/workerproc"
	"github.com/outboxrelay/outbox/mongo"
)

// TestConsoleCommand runs `worker console` on FerretDB, with no broker
// configured: the overview counts the FAILED event once the sampler has
// run, its page shows the attempt history with the hostile payload
// escaped, a POST is refused, and SIGTERM stops it with exit code 0.
func TestConsoleCommand(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	now := time.Now().UTC()
	failed := draftDoc(t, events.Draft{ID: "bad-1", Type: "order.created", Payload: bson.D{{Key: "note", Value: "<script>alert(1)</script>"}}}, now,
		bson.E{Key: events.FieldStatus, Value: events.StatusFailed},
		bson.E{Key: events.FieldLastError, Value: "gave up after 3 attempts: nacked"},
		bson.E{Key: events.FieldAttemptErrors, Value: bson.A{
			bson.D{{Key: "at", Value: now}, {Key: "workerId", Value: "relay-1"}, {Key: "reason", Value: "max_attempts"}, {Key: "error", Value: "gave up after 3 attempts: nacked"}},
		}})
	_, env := toolsOutbox(ctx, t, testenv.MongoURI(t), testenv.Database(t), []any{failed})
	addr, err := workerproc.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	env["OUTBOX_CONSOLE_ADDR"] = addr
	env["OUTBOX_AMQP_URL"] = "amqp://nobody@127.0.0.1:1/" // never dialled
	p := startConsole(t, env)
	base := "http://" + addr

	var ov console.Overview
	testenv.Eventually(t, time.Minute, func() (bool, string) {
		code, body := consoleGet(ctx, base+"/api/overview")
		ok := code == http.StatusOK && json.Unmarshal([]byte(body), &ov) == nil && ov.Counts["FAILED"] == 1
		return ok, "the overview counting the FAILED event: " + body
	})
	code, body := consoleGet(ctx, base+"/events/bad-1")
	if code != http.StatusOK || !strings.Contains(body, "relay-1") || !strings.Contains(body, "max_attempts") ||
		strings.Contains(body, "<script>alert") {
		t.Errorf("GET /events/bad-1 = %d; want the history shown and the payload escaped:\n%s", code, body)
	}
	// DNS rebinding: a page of another site whose name now points at the
	// console sends that name as Host, and reads nothing.
	rebound, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/events?status=FAILED", nil)
	if err != nil {
		t.Fatal(err)
	}
	rebound.Host = "attacker.example"
	if resp, err := http.DefaultClient.Do(rebound); err != nil || resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("GET /api/events with Host attacker.example = %v, %v; want 421", resp, err)
	} else {
		_ = resp.Body.Close()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/events/bad-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST = %d, want 403", resp.StatusCode)
	}
	stopWorkers(t, p)
}

// startConsole starts `worker console` with env; in t.Cleanup it is
// killed if it still runs, and its log printed if the test failed.
func startConsole(t *testing.T, env map[string]string) *workerproc.Proc {
	t.Helper()
	p, err := workerproc.Start(workerproc.Config{
		Bin: workerBinary(t), Name: "console", Args: []string{"console"}, Env: workerproc.Environ(env),
		LogPath: filepath.Join(t.TempDir(), "console.log"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("console's log:\n%s", p.Tail(30))
		}
	})
	return p
}

// waitConsoleOutboxes waits until n outboxes of the console p serves are
// available: it serves at once, and each outbox once its database has
// answered.
func waitConsoleOutboxes(t *testing.T, p *workerproc.Proc, n int) {
	t.Helper()
	testenv.Eventually(t, time.Minute, func() (bool, string) {
		log := p.LogSince(0)
		return strings.Count(log, `"console outbox available"`) >= n, fmt.Sprintf("%d outboxes of the console available", n)
	})
}

func consoleGet(ctx context.Context, url string) (int, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestConsoleActions runs `worker console` with its actions on: without
// a token it refuses to start; with one, a requeue from the event's page
// moves the event back to NEW and is recorded with who did it and why.
func TestConsoleActions(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	failed := draftDoc(t, events.Draft{ID: "bad-2", Type: "order.created", Payload: bson.D{{Key: "n", Value: 1}}}, time.Now().UTC(),
		bson.E{Key: events.FieldStatus, Value: events.StatusFailed}, bson.E{Key: events.FieldLastError, Value: "nacked"})
	db := testenv.Database(t)
	coll, env := toolsOutbox(ctx, t, testenv.MongoURI(t), db, []any{failed})
	addr, err := workerproc.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	env["OUTBOX_CONSOLE_ADDR"] = addr
	env["OUTBOX_CONSOLE_WRITES"] = "true"
	var stderr strings.Builder
	if code := run(ctx, []string{"console"}, func(k string) string { return env[k] }, nil, io.Discard, &stderr); code != 2 ||
		!strings.Contains(stderr.String(), "OUTBOX_CONSOLE_TOKEN") {
		t.Errorf("console with writes and no token exited %d saying %q, want 2 naming OUTBOX_CONSOLE_TOKEN", code, stderr.String())
	}
	const token = "console-token-for-the-test"
	env["OUTBOX_CONSOLE_TOKEN"] = token
	p := startConsole(t, env)
	base := "http://" + addr
	testenv.Eventually(t, time.Minute, func() (bool, string) {
		code, body := consoleGet(ctx, base+"/api/overview")
		return code == http.StatusUnauthorized, "the console asking for credentials: " + body
	})
	waitConsoleOutboxes(t, p, 1)
	form := url.Values{"reason": {"the route exists now"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/events/bad-2/requeue", strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth("ana", token)
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("POST requeue = %d, want 303", resp.StatusCode)
	}
	var e events.Event
	if err := coll.FindOne(ctx, bson.D{{Key: events.FieldID, Value: "bad-2"}}).Decode(&e); err != nil || e.Status != events.StatusNew {
		t.Errorf("bad-2 after the requeue: %s, %v; want NEW", e.Status, err)
	}
	store := mongo.New(db.Client(), mongo.Config{Database: db.Name(), Collection: coll.Name()})
	actions, err := store.Actions(ctx, 10)
	if err != nil || len(actions) != 1 || actions[0].By != "ana (shared token)" || actions[0].Reason != "the route exists now" || actions[0].Source != "console" {
		t.Errorf("audit = %+v, %v; want ana's requeue from the console", actions, err)
	}
	stopWorkers(t, p)
}
