package wake_test

import (
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/wake"
)

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, testenv.WaitTimeout, func() (bool, string) { return cond(), what })
}

func TestWatcherWakesOnInsertsOrFallsBackToPolling(t *testing.T) {
	t.Parallel()
	coll := testenv.Database(t).Collection(mongo.CollectionDefault)
	var logs testenv.LogBuffer
	var triggers atomic.Int32
	w, err := wake.New(wake.Config{
		Collection: coll,
		Trigger:    func() { triggers.Add(1) },
		BackoffMin: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, w)
	waitFor(t, "the first stream opened or refused", func() bool { return w.Mode() != wake.ModeStarting })

	insert := func() {
		t.Helper()
		if _, err := coll.InsertOne(t.Context(), bson.D{
			{Key: events.FieldType, Value: "order.created"},
			{Key: events.FieldStatus, Value: events.StatusNew},
			{Key: events.FieldCreatedAt, Value: time.Now()},
		}); err != nil {
			t.Fatal(err)
		}
	}
	if !testenv.IsFerretDB() {
		// A replica set: an insert of a NEW event wakes the claimer.
		if w.Mode() != wake.ModeChangeStream {
			t.Fatalf("Mode = %q on MongoDB (a replica set), want %q; log:\n%s", w.Mode(), wake.ModeChangeStream, logs.String())
		}
		insert()
		waitFor(t, "a trigger after an insert", func() bool { return triggers.Load() > 0 })
		return
	}
	// FerretDB refuses change streams: the watcher says so once and ends.
	if w.Mode() != wake.ModePolling {
		t.Fatalf("Mode = %q on FerretDB, want %q; log:\n%s", w.Mode(), wake.ModePolling, logs.String())
	}
	insert()
	if err := w.Stop(t.Context()); err != nil { // the watcher has ended: Stop returns at once
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "change streams are not supported"); n != 1 {
		t.Errorf("the fallback was logged %d times, want once; log:\n%s", n, logs.String())
	}
	if strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("a refused change stream is not a warning:\n%s", logs.String())
	}
	if n := triggers.Load(); n != 0 {
		t.Errorf("%d triggers without a change stream, want 0", n)
	}
	t.Logf("fallback log: %s", strings.TrimSpace(logs.String()))
}
