package mongo_test

import (
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/ownership"
)

// freshStore is a store on an empty database of its own, not prepared.
func freshStore(t *testing.T) (*mongo.Store, *driver.Database) {
	t.Helper()
	db := testenv.Database(t)
	return mongo.New(db.Client(), mongo.Config{Database: db.Name(), Logger: slog.New(slog.DiscardHandler)}), db
}

// Setup creates every collection and index of the schema and says so,
// once: run again, it does and says nothing; the relay's check then finds
// nothing missing.
func TestSetupCreatesWhatIsMissingOnce(t *testing.T) {
	t.Parallel()
	s, db := freshStore(t)
	done, err := s.Setup(t.Context())
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	text := strings.Join(done, "\n")
	for _, want := range []string{
		"created collection " + db.Name() + ".events\n",
		"created index outbox_claim {status: 1, createdAt: 1} on " + db.Name() + ".events",
		"created index outbox_claim_order", "created index outbox_claim_lane", "created index outbox_claim_retry", "created index outbox_stale", "created index outbox_retention", "created index outbox_sequence",
		"created collection " + db.Name() + ".events_owners",
		"created collection " + db.Name() + ".events_paused",
		"created collection " + db.Name() + ".events_audit",
	} {
		if !strings.Contains(text+"\n", want) {
			t.Errorf("Setup said\n%s\nwhich lacks %q", text, want)
		}
	}
	names, err := db.ListCollectionNames(t.Context(), bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"events", "events_owners", "events_paused", "events_audit"} {
		if !slices.Contains(names, c) {
			t.Errorf("after Setup the database has %v, not %s", names, c)
		}
	}
	again, err := s.Setup(t.Context())
	if err != nil || len(again) != 0 {
		t.Errorf("Setup again = %q, %v; want nothing done", again, err)
	}
	if missing, err := s.Missing(t.Context()); err != nil || len(missing) != 0 {
		t.Errorf("Missing after Setup = %v, %v; want none", missing, err)
	}
}

// Without create, the relay's preparation creates nothing: it names what
// is missing and the command to run. After worker setup it passes, and
// creates nothing either.
func TestPrepareRunChecksWithoutCreating(t *testing.T) {
	t.Parallel()
	s, db := freshStore(t)
	_, err := s.PrepareRun(t.Context(), false)
	var missing *mongo.MissingError
	if !errors.As(err, &missing) {
		t.Fatalf("PrepareRun on an empty database = %v, want a *MissingError", err)
	}
	for _, want := range []string{"collection " + db.Name() + ".events;", "index outbox_claim_order {status: 1, retryAt: 1, createdAt: 1, _id: 1} on " + db.Name() + ".events",
		"collection " + db.Name() + ".events_owners", "worker setup"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("PrepareRun's error lacks %q:\n%v", want, err)
		}
	}
	// The paused types and the audit are not the relay's to need.
	if strings.Contains(err.Error(), "events_audit") || strings.Contains(err.Error(), "events_paused") {
		t.Errorf("PrepareRun's error names a collection the relay does not need:\n%v", err)
	}
	if names, _ := db.ListCollectionNames(t.Context(), bson.D{}); len(names) != 0 {
		t.Errorf("PrepareRun without create made %v", names)
	}
	if _, err := s.Setup(t.Context()); err != nil {
		t.Fatal(err)
	}
	if done, err := s.PrepareRun(t.Context(), false); err != nil || len(done) != 0 {
		t.Errorf("PrepareRun after Setup = %q, %v; want nothing done, no error", done, err)
	}
}

// With create (OUTBOX_SETUP=auto), the relay creates only what it needs,
// and says what.
func TestPrepareRunCreates(t *testing.T) {
	t.Parallel()
	s, db := freshStore(t)
	done, err := s.PrepareRun(t.Context(), true)
	if err != nil {
		t.Fatal(err)
	}
	if len(done) != 9 { // the outbox, its 7 indexes, the owners
		t.Errorf("PrepareRun created %d things, want 9:\n%s", len(done), strings.Join(done, "\n"))
	}
	if missing, err := s.Missing(t.Context()); err != nil || len(missing) != 0 {
		t.Errorf("Missing after PrepareRun = %v, %v; want none", missing, err)
	}
	if names, _ := db.ListCollectionNames(t.Context(), bson.D{}); slices.Contains(names, "events_audit") {
		t.Errorf("the relay created the audit collection: %v", names)
	}
}

// Every document the worker owns carries the schema version it was
// written under.
func TestOwnedDocumentsCarryTheSchemaVersion(t *testing.T) {
	t.Parallel()
	s, db := freshStore(t)
	if _, err := s.Setup(t.Context()); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if _, err := s.Owners().Insert(t.Context(), []ownership.Term{{Partition: 3, Term: 1, Owner: "w1", ExpiresAt: now.Add(time.Minute)}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Owners().Heartbeat(t.Context(), ownership.Member{WorkerID: "w1", SeenAt: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pause(t.Context(), events.Pause{Type: "order.paid", By: "op", Reason: "test", At: now}); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordAction(t.Context(), mongo.Action{At: now, By: "op", Name: "pause", Reason: "test", Target: "order.paid", Count: 1, Source: "cli"}); err != nil {
		t.Fatal(err)
	}
	if err := mongo.EnsureFences(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"events_owners", "events_paused", "events_audit", "events_fences"} {
		n, err := db.Collection(c).CountDocuments(t.Context(), bson.D{{Key: mongo.FieldSchema, Value: bson.D{{Key: "$ne", Value: mongo.SchemaVersion}}}})
		if err != nil {
			t.Fatal(err)
		}
		total, _ := db.Collection(c).CountDocuments(t.Context(), bson.D{})
		if total == 0 || n != 0 {
			t.Errorf("%s: %d of %d documents lack schema %d", c, n, total, mongo.SchemaVersion)
		}
	}
}

// A document of a newer schema than this worker knows is refused, with
// an error that says so, by every read of the documents the worker owns;
// one of no schema field (written before it existed) is read as before.
func TestNewerSchemaIsRefused(t *testing.T) {
	t.Parallel()
	s, db := freshStore(t)
	if _, err := s.Setup(t.Context()); err != nil {
		t.Fatal(err)
	}
	newer := mongo.SchemaVersion + 1
	now := time.Now().UTC().Truncate(time.Millisecond)
	insert := func(coll string, doc bson.D) {
		t.Helper()
		if _, err := db.Collection(coll).InsertOne(t.Context(), doc); err != nil {
			t.Fatal(err)
		}
	}
	// Written before the field existed: read as version 1.
	insert("events_owners", bson.D{{Key: "_id", Value: "member/old"}, {Key: "workerId", Value: "old"}, {Key: "seenAt", Value: now}})
	if _, members, err := s.Owners().Read(t.Context()); err != nil || len(members) != 1 {
		t.Fatalf("Read of a document without a schema = %v, %v; want it read", members, err)
	}
	insert("events_owners", bson.D{{Key: "_id", Value: "member/new"}, {Key: "workerId", Value: "new"}, {Key: "seenAt", Value: now}, {Key: "schema", Value: newer}})
	insert("events_paused", bson.D{{Key: "_id", Value: "order.paid"}, {Key: "by", Value: "op"}, {Key: "at", Value: now}, {Key: "schema", Value: newer}})
	insert("events_audit", bson.D{{Key: "at", Value: now}, {Key: "action", Value: "pause"}, {Key: "schema", Value: newer}})
	insert("events_fences", bson.D{{Key: "_id", Value: "fence/5"}, {Key: "tenure", Value: int64(1)}, {Key: "schema", Value: newer}})

	reads := map[string]func() error{
		"owners": func() error { _, _, err := s.Owners().Read(t.Context()); return err },
		"paused": func() error { _, err := s.PausedTypes(t.Context()); return err },
		"audit":  func() error { _, err := s.Actions(t.Context(), 10); return err },
		"fences": func() error { _, err := mongo.ReadFences(t.Context(), s, []int{5}); return err },
	}
	for name, read := range reads {
		err := read()
		var ns *mongo.NewerSchemaError
		if !errors.As(err, &ns) || ns.Version != newer {
			t.Errorf("%s: read = %v, want a *NewerSchemaError of version %d", name, err, newer)
			continue
		}
		if !strings.Contains(err.Error(), "newer version of the worker") || !strings.Contains(err.Error(), "docs/upgrading.md") {
			t.Errorf("%s: the error does not say what to do: %v", name, err)
		}
	}
}

// A heartbeat without a schema version is a replica of an earlier
// version: the worker says so once, naming it, and reads it as before.
func TestOwnersNoteAnEarlierVersion(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	var logs testenv.LogBuffer
	s := mongo.New(db.Client(), mongo.Config{Database: db.Name(), Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if _, err := s.Setup(t.Context()); err != nil {
		t.Fatal(err)
	}
	owners := s.Owners()
	now := time.Now().UTC().Truncate(time.Millisecond)
	if err := owners.Heartbeat(t.Context(), ownership.Member{WorkerID: "current", SeenAt: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Collection("events_owners").InsertOne(t.Context(),
		bson.D{{Key: "_id", Value: "member/old-1"}, {Key: "workerId", Value: "old-1"}, {Key: "seenAt", Value: now}}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, members, err := owners.Read(t.Context()); err != nil || len(members) != 2 {
			t.Fatalf("Read = %v, %v; want both members", members, err)
		}
	}
	if got := strings.Count(logs.String(), "a replica of an earlier version shares this outbox"); got != 1 {
		t.Errorf("the earlier version was noted %d times, want once:\n%s", got, logs.String())
	}
	if !strings.Contains(logs.String(), `"replica":"old-1"`) || strings.Contains(logs.String(), `"replica":"current"`) {
		t.Errorf("the note does not name only the earlier replica:\n%s", logs.String())
	}
}

// Replicas that start at once on an empty database each create what is
// missing; what another created meanwhile is no error.
func TestPrepareRunConcurrently(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	errs := make(chan error, 4)
	for range cap(errs) {
		go func() {
			s := mongo.New(db.Client(), mongo.Config{Database: db.Name(), Logger: slog.New(slog.DiscardHandler)})
			_, err := s.PrepareRun(t.Context(), true)
			errs <- err
		}()
	}
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Errorf("PrepareRun beside others: %v", err)
		}
	}
}
