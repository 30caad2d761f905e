package mongotest

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	driver "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
)

// Sent is one command a client started.
type Sent struct {
	Name    string
	Command bson.Raw
}

// Recorder keeps the commands a client starts, for tests that check what
// was sent (not how long it took).
type Recorder struct {
	mu   sync.Mutex
	sent []Sent
}

// Monitor is the command monitor to give the client.
func (r *Recorder) Monitor() *event.CommandMonitor {
	return &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.sent = append(r.sent, Sent{Name: e.CommandName, Command: slices.Clone(e.Command)})
	}}
}

// Take returns the commands started since the last Take and forgets them.
func (r *Recorder) Take() []Sent {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.sent
	r.sent = nil
	return out
}

// RecordingStore is Store on a client of its own whose commands the
// returned Recorder keeps, from after Prepare.
func RecordingStore(t testing.TB) (*mongo.Store, *Recorder) {
	t.Helper()
	rec := &Recorder{}
	client, err := driver.Connect(options.Client().ApplyURI(testenv.MongoURI(t)).
		SetMaxPoolSize(testenv.ClientMaxPoolSize).SetMonitor(rec.Monitor()))
	if err != nil {
		t.Fatalf("mongotest: connect: %v", err)
	}
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	db := client.Database(testenv.UniqueName(t, "t_"))
	t.Cleanup(func() { _ = db.Drop(context.Background()) })
	s := mongo.New(client, mongo.Config{Database: db.Name(), Logger: slog.New(slog.DiscardHandler)})
	if err := s.Prepare(t.Context()); err != nil {
		t.Fatalf("mongotest: Prepare: %v", err)
	}
	rec.Take()
	return s, rec
}
