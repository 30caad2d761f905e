package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
)

// commandRecorder keeps the commands a client sends.
type commandRecorder struct {
	mu   sync.Mutex
	cmds []*event.CommandStartedEvent
}

func (r *commandRecorder) monitor() *event.CommandMonitor {
	return &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		r.mu.Lock()
		r.cmds = append(r.cmds, e)
		r.mu.Unlock()
	}}
}

func (r *commandRecorder) started() []*event.CommandStartedEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*event.CommandStartedEvent(nil), r.cmds...)
}

// withQuery adds query options to a MongoDB URI.
func withQuery(uri, query string) string {
	sep := "?"
	if strings.Contains(uri, "?") {
		sep = "&"
	} else if !strings.HasSuffix(uri, "/") {
		sep = "/?"
	}
	return uri + sep + query
}

// TestMongoClientPinsConcerns reads the commands the worker's client sends
// while the store claims, marks, releases, deletes and requeues, from a URI
// that asks for weaker ones: every read carries read concern majority, every
// write w: majority with the journal (on its commitTransaction inside a
// transaction), and no read asks for a secondary.
func TestMongoClientPinsConcerns(t *testing.T) {
	t.Parallel()
	weak := "w=1&journal=false&readConcernLevel=local&readPreference=secondaryPreferred"
	cfg, _, err := loadConfig("run", nil, envOf(map[string]string{
		"OUTBOX_MONGO_URI": withQuery(testenv.MongoURI(t), weak),
	}), relayCommand, nil)
	if err != nil {
		t.Fatalf("loadConfig: %v", err)
	}
	if got := overriddenURIOptions(cfg.MongoURI); len(got) != 4 {
		t.Errorf("overridden URI options = %v, want the four of %s", got, weak)
	}
	rec := &commandRecorder{}
	client, err := driver.Connect(mongoClientOptions(cfg, "outbox-worker-test").SetMonitor(rec.monitor()).SetMaxPoolSize(4))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = client.Disconnect(context.WithoutCancel(t.Context())) })
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	cfg.MongoDatabase = testenv.UniqueName(t, "concerns_")
	t.Cleanup(func() { _ = client.Database(cfg.MongoDatabase).Drop(context.WithoutCancel(t.Context())) })
	store := mongo.New(client, mongoStoreConfig(cfg, slog.New(slog.DiscardHandler)))
	if err := store.Prepare(ctx); err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	var docs []any
	for i := range 6 {
		d, err := events.Draft{ID: fmt.Sprintf("e-%d", i), Type: "t", Payload: bson.D{{Key: "n", Value: i}}}.Document(now.Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, d)
	}
	if _, err := store.Collection().InsertMany(ctx, docs); err != nil {
		t.Fatalf("insert: %v", err)
	}
	lease := events.Lease{WorkerID: "w", Token: "tok", At: now}
	res, err := store.Claim(ctx, lease, events.ClaimLimit{Events: 6})
	if err != nil || len(res.Claimed) != 6 {
		t.Fatalf("Claim = %d events, %v; want 6", len(res.Claimed), err)
	}
	if n, err := store.MarkPublished(ctx, lease, []any{"e-0", "e-1", "e-2"}, now.Add(-48*time.Hour)); err != nil || n != 3 {
		t.Fatalf("MarkPublished = %d, %v; want 3", n, err)
	}
	if n, err := store.Release(ctx, lease, events.Release{IDs: []any{"e-3", "e-4", "e-5"}, Status: events.StatusFailed, LastError: "x"}); err != nil || n != 3 {
		t.Fatalf("Release = %d, %v; want 3", n, err)
	}
	if n, err := store.DeletePublished(ctx, now.Add(-24*time.Hour), 10); err != nil || n != 3 {
		t.Fatalf("DeletePublished = %d, %v; want 3", n, err)
	}
	if n, err := store.Requeue(ctx, mongo.RequeueFilter{IDs: []string{"e-3"}}, false); err != nil || n != 1 {
		t.Fatalf("Requeue = %d, %v; want 1", n, err)
	}

	seen := map[string]int{}
	for _, e := range rec.started() {
		if e.DatabaseName != cfg.MongoDatabase {
			continue // handshakes, hello, endSessions
		}
		seen[e.CommandName]++
		_, inTxn := e.Command.Lookup("autocommit").BooleanOK() // only a transaction's commands carry it
		_, first := e.Command.Lookup("startTransaction").BooleanOK()
		if mode, ok := e.Command.Lookup("$readPreference", "mode").StringValueOK(); ok && mode != "primary" && mode != "primaryPreferred" {
			t.Errorf("%s sent $readPreference %s", e.CommandName, mode)
		}
		switch e.CommandName {
		case "find", "count", "aggregate":
			if inTxn && !first {
				continue // only a transaction's first command carries its read concern
			}
			if got, _ := e.Command.Lookup("readConcern", "level").StringValueOK(); got != "majority" {
				t.Errorf("%s sent readConcern %v, want {level: majority}", e.CommandName, e.Command.Lookup("readConcern"))
			}
		case "insert", "update", "delete", "commitTransaction":
			if inTxn && e.CommandName != "commitTransaction" {
				continue // a transaction's statements carry none: its commit does
			}
			w, _ := e.Command.Lookup("writeConcern", "w").StringValueOK()
			j, _ := e.Command.Lookup("writeConcern", "j").BooleanOK()
			if w != "majority" || !j {
				t.Errorf("%s sent writeConcern %v, want {w: majority, j: true}", e.CommandName, e.Command.Lookup("writeConcern"))
			}
		}
	}
	for _, name := range []string{"find", "update", "delete", "insert"} {
		if seen[name] == 0 {
			t.Errorf("no %s command seen (saw %v)", name, seen)
		}
	}
	if store.SupportsTransactions() && seen["commitTransaction"] == 0 {
		t.Errorf("transactions are supported but no commitTransaction was seen (saw %v)", seen)
	} else if !store.SupportsTransactions() {
		t.Log("no transactions on this server: the in-transaction checks ran on none")
	}
}
