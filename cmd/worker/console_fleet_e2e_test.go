package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/console"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/internal/workerproc"
)

// TestConsoleCommandFleet runs `worker console` on a fleet file of two
// outboxes in two databases, each holding one FAILED event of its own:
// each outbox's overview counts its event, each list shows its own, and
// an outbox the file does not list, or none, is refused.
func TestConsoleCommandFleet(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	uri := testenv.MongoURI(t)
	var file strings.Builder
	file.WriteString("outboxes:\n")
	for _, name := range []string{"a", "b"} {
		failed := draftDoc(t, events.Draft{ID: name + "-bad", Type: "order.created", Payload: bson.D{{Key: "n", Value: 1}}}, time.Now().UTC(),
			bson.E{Key: events.FieldStatus, Value: events.StatusFailed}, bson.E{Key: events.FieldLastError, Value: "gave up: nacked"})
		db := testenv.Database(t)
		coll, _ := toolsOutbox(ctx, t, uri, db, []any{failed})
		fmt.Fprintf(&file, "  - name: %s\n    database: %s\n    collection: %s\n    exchange: ex\n", name, db.Name(), coll.Name())
	}
	addr, err := workerproc.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	p := startConsole(t, map[string]string{
		"OUTBOX_MONGO_URI": uri, "OUTBOX_FLEET_FILE": writeFleet(t, file.String()), "OUTBOX_CONSOLE_ADDR": addr,
	})
	base := "http://" + addr
	for _, name := range []string{"a", "b"} {
		testenv.Eventually(t, time.Minute, func() (bool, string) {
			var ov console.Overview
			code, body := consoleGet(ctx, base+"/o/"+name+"/api/overview")
			return code == http.StatusOK && json.Unmarshal([]byte(body), &ov) == nil && ov.Counts["FAILED"] == 1,
				"outbox " + name + "'s overview counting its FAILED event: " + body
		})
		var list console.EventList
		code, body := consoleGet(ctx, base+"/o/"+name+"/api/events?status=FAILED")
		if err := json.Unmarshal([]byte(body), &list); code != http.StatusOK || err != nil || len(list.Events) != 1 || list.Events[0].ID != name+"-bad" {
			t.Errorf("outbox %s's FAILED list = %d %s, want its own event alone", name, code, body)
		}
	}
	if code, body := consoleGet(ctx, base+"/o/nope/api/overview"); code != http.StatusNotFound || !strings.Contains(body, "it serves a, b") {
		t.Errorf("GET /o/nope/api/overview = %d %s, want 404 naming the outboxes served", code, body)
	}
	if code, _ := consoleGet(ctx, base+"/api/overview"); code != http.StatusBadRequest {
		t.Errorf("GET /api/overview without an outbox = %d, want 400", code)
	}
	stopWorkers(t, p)
}

// TestConsoleCommandFleetDatabaseDown runs `worker console` on a fleet
// file of two outboxes on two clusters, b's reached through a proxy cut
// before the console starts: the console starts and serves a, b's API
// and pages answer 503 naming b and its database, and once the proxy is
// restored b is served, without a restart.
func TestConsoleCommandFleetDatabaseDown(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	uri := testenv.MongoURI(t)
	proxied, proxy := testenv.Proxied(t, uri)
	proxy.Cut()
	var file strings.Builder
	file.WriteString("outboxes:\n")
	for name, at := range map[string]string{"a": uri, "b": proxied} {
		failed := draftDoc(t, events.Draft{ID: name + "-bad", Type: "order.created", Payload: bson.D{{Key: "n", Value: 1}}}, time.Now().UTC(),
			bson.E{Key: events.FieldStatus, Value: events.StatusFailed}, bson.E{Key: events.FieldLastError, Value: "gave up: nacked"})
		db := testenv.Database(t)
		coll, _ := toolsOutbox(ctx, t, uri, db, []any{failed})
		fmt.Fprintf(&file, "  - name: %s\n    mongo_uri: %s\n    database: %s\n    collection: %s\n    exchange: ex\n", name, at, db.Name(), coll.Name())
	}
	addr, err := workerproc.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	p := startConsole(t, map[string]string{
		"OUTBOX_MONGO_URI": uri, "OUTBOX_FLEET_FILE": writeFleet(t, file.String()), "OUTBOX_CONSOLE_ADDR": addr,
	})
	base := "http://" + addr
	countsItsEvent := func(name string) func() (bool, string) {
		return func() (bool, string) {
			var ov console.Overview
			code, body := consoleGet(ctx, base+"/o/"+name+"/api/overview")
			return code == http.StatusOK && json.Unmarshal([]byte(body), &ov) == nil && ov.Counts["FAILED"] == 1,
				"outbox " + name + "'s overview counting its FAILED event: " + body
		}
	}
	testenv.Eventually(t, time.Minute, countsItsEvent("a"))
	testenv.Eventually(t, time.Minute, func() (bool, string) {
		code, body := consoleGet(ctx, base+"/o/b/api/overview")
		return code == http.StatusServiceUnavailable && strings.Contains(body, `outbox \"b\" is unavailable: its database is unreachable`),
			fmt.Sprintf("outbox b's overview answering 503, its database unreachable: %d %s", code, body)
	})
	code, page := consoleGetPage(ctx, t, base+"/o/b/events?status=FAILED")
	if code != http.StatusServiceUnavailable || !strings.Contains(page, "outbox &#34;b&#34; is unavailable") || strings.Contains(page, "a-bad") {
		t.Errorf("GET b's FAILED list while its database is down = %d, want 503 naming b and none of a's events:\n%s", code, page)
	}
	if code, page := consoleGetPage(ctx, t, base+"/o/a/events?status=FAILED"); code != http.StatusOK || !strings.Contains(page, "b (unavailable)") {
		t.Errorf("GET a's FAILED list = %d, want 200 with b marked unavailable in the selector:\n%s", code, page)
	}
	proxy.Restore()
	testenv.Eventually(t, 2*time.Minute, countsItsEvent("b"))
	stopWorkers(t, p)
}

// consoleGetPage gets url as a browser does, asking for HTML.
func consoleGetPage(ctx context.Context, t *testing.T, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/html")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}
