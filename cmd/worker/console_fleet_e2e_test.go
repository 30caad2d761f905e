package main

import (
	"context"
	"encoding/json"
	"fmt"
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
