package mongo_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	driver "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
)

// TestCommandTracer: each command is a CLIENT span, a child of the span
// of the context it was sent with, named "<command> <collection>", with
// the database conventions; a failed one is an error with the server's
// code; no span carries the documents.
func TestCommandTracer(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	client, err := driver.Connect(options.Client().ApplyURI(testenv.MongoURI(t)).SetMaxPoolSize(4).
		SetMonitor(mongo.CommandTracer(tp)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Disconnect(context.WithoutCancel(t.Context())) })
	db := client.Database(testenv.UniqueName(t, "t_"))
	t.Cleanup(func() { _ = db.Drop(context.WithoutCancel(t.Context())) })
	coll := db.Collection("events")

	ctx, parent := tp.Tracer("test").Start(t.Context(), "relay batch")
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "e1"}, {Key: "payload", Value: "card 4111-secret"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "e1"}}); !driver.IsDuplicateKeyError(err) {
		t.Fatalf("second insert: %v, want a duplicate key error", err)
	}
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: "e1"}}).Err(); err != nil {
		t.Fatal(err)
	}
	parent.End()

	var inserts, finds []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Parent().SpanID() != parent.SpanContext().SpanID() {
			continue // the driver's own commands (hello, ...) outside the test's span
		}
		switch s.Name() {
		case "insert events":
			inserts = append(inserts, s)
		case "find events":
			finds = append(finds, s)
		default:
			t.Errorf("unexpected span %q under the batch", s.Name())
		}
		if s.SpanKind() != trace.SpanKindClient {
			t.Errorf("%s: kind %v, want client", s.Name(), s.SpanKind())
		}
		attrs := attribute.NewSet(s.Attributes()...)
		for k, want := range map[attribute.Key]string{
			"db.system.name": "mongodb", "db.collection.name": "events", "db.namespace": db.Name(),
		} {
			if v, _ := attrs.Value(k); v.AsString() != want {
				t.Errorf("%s: %s = %q, want %q", s.Name(), k, v.AsString(), want)
			}
		}
		if v, ok := attrs.Value("server.port"); !ok || v.AsInt64() == 0 {
			t.Errorf("%s: no server.port", s.Name())
		}
		for _, kv := range s.Attributes() {
			if strings.Contains(kv.Value.String(), "secret") {
				t.Errorf("%s: attribute %s holds the document: %s", s.Name(), kv.Key, kv.Value.String())
			}
		}
	}
	if len(inserts) != 2 || len(finds) != 1 {
		t.Fatalf("%d insert and %d find spans under the batch, want 2 and 1", len(inserts), len(finds))
	}
}

// TestCommandTracerFailedCommand: a command the server refuses ends its
// span with an error status and the server's code, never its message.
func TestCommandTracerFailedCommand(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	client, err := driver.Connect(options.Client().ApplyURI(testenv.MongoURI(t)).SetMaxPoolSize(2).
		SetMonitor(mongo.CommandTracer(tp)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Disconnect(context.WithoutCancel(t.Context())) })
	db := client.Database(testenv.UniqueName(t, "t_"))
	ctx, parent := tp.Tracer("test").Start(t.Context(), "test")
	err = db.RunCommand(ctx, bson.D{{Key: "noSuchCommand", Value: 1}}).Err()
	parent.End()
	var ce driver.CommandError
	if !errors.As(err, &ce) {
		t.Fatalf("noSuchCommand: %v, want a command error", err)
	}
	for _, s := range rec.Ended() {
		if s.Parent().SpanID() != parent.SpanContext().SpanID() {
			continue
		}
		attrs := attribute.NewSet(s.Attributes()...)
		code, _ := attrs.Value("db.response.status_code")
		if s.Name() != "noSuchCommand" || s.Status().Code != codes.Error || code.AsString() != strconv.Itoa(int(ce.Code)) {
			t.Errorf("span %q status %v code %q, want noSuchCommand, an error, code %d", s.Name(), s.Status(), code.AsString(), ce.Code)
		}
		if strings.Contains(s.Status().Description, ce.Message) {
			t.Errorf("status %q quotes the server's message", s.Status().Description)
		}
		return
	}
	t.Fatal("no span for the failed command")
}

// TestMonitors: every monitor gets every event, in order; nil ones and
// nil handlers are skipped.
func TestMonitors(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []string
	note := func(s string) { mu.Lock(); got = append(got, s); mu.Unlock() }
	a := &event.CommandMonitor{
		Started:   func(context.Context, *event.CommandStartedEvent) { note("a started") },
		Succeeded: func(context.Context, *event.CommandSucceededEvent) { note("a succeeded") },
	}
	b := &event.CommandMonitor{
		Started: func(context.Context, *event.CommandStartedEvent) { note("b started") },
		Failed:  func(context.Context, *event.CommandFailedEvent) { note("b failed") },
	}
	m := mongo.Monitors(a, nil, b)
	m.Started(t.Context(), &event.CommandStartedEvent{})
	m.Succeeded(t.Context(), &event.CommandSucceededEvent{})
	m.Failed(t.Context(), &event.CommandFailedEvent{})
	want := "a started,b started,a succeeded,b failed"
	if strings.Join(got, ",") != want {
		t.Errorf("events %v, want %s", got, want)
	}
}
