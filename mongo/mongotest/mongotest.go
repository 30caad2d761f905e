// Package mongotest gives tests the outbox store of package mongo,
// prepared on a database of their own, the event documents they put in it,
// the statuses they read back, and a recorder of the commands a store sends.
// It sits next to the package it serves, as net/http/httptest does, and is
// imported only from _test.go files.
//
// It is a package of its own so that package mongo, which the worker ships,
// imports neither testing nor internal/testenv, and so that
// internal/testenv, which gives the servers, imports none of the packages
// it serves.
package mongotest

import (
	"log/slog"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
)

// Store returns a store on a database of this test's own (see
// testenv.Database), with its collection and indexes prepared and a logger
// that discards.
func Store(t testing.TB) *mongo.Store {
	t.Helper()
	db := testenv.Database(t)
	s := mongo.New(db.Client(), mongo.Config{Database: db.Name(), Logger: slog.New(slog.DiscardHandler)})
	if err := s.Prepare(t.Context()); err != nil {
		t.Fatalf("mongotest: Prepare: %v", err)
	}
	return s
}

// Event returns a valid event document of type order.created with the
// given _id, status and createdAt, followed by the extra fields. BSON dates
// keep milliseconds: a createdAt the test compares later should be a whole
// millisecond.
func Event(id any, status events.Status, createdAt time.Time, extra ...bson.E) bson.D {
	d := bson.D{
		{Key: events.FieldID, Value: id},
		{Key: events.FieldType, Value: "order.created"},
		{Key: events.FieldPayload, Value: bson.D{{Key: "n", Value: 1}}},
		{Key: events.FieldStatus, Value: status},
		{Key: events.FieldCreatedAt, Value: createdAt},
	}
	return append(d, extra...)
}

// Insert inserts the event documents into coll, failing the test if it
// cannot.
func Insert(t testing.TB, coll *driver.Collection, docs ...bson.D) {
	t.Helper()
	if _, err := coll.InsertMany(t.Context(), docs); err != nil {
		t.Fatalf("mongotest: insert %d events: %v", len(docs), err)
	}
}

// Statuses returns the status of every event in coll, by its _id as the
// message id (testenv.MessageID), so that a test compares what a service
// left with one map.
func Statuses(t testing.TB, coll *driver.Collection) map[string]events.Status {
	t.Helper()
	cur, err := coll.Find(t.Context(), bson.D{})
	if err != nil {
		t.Fatalf("mongotest: find events: %v", err)
	}
	var all []struct {
		ID     any           `bson:"_id"`
		Status events.Status `bson:"status"`
	}
	if err := cur.All(t.Context(), &all); err != nil {
		t.Fatalf("mongotest: read events: %v", err)
	}
	out := make(map[string]events.Status, len(all))
	for _, e := range all {
		out[testenv.MessageID(e.ID)] = e.Status
	}
	return out
}

// IDs returns the _ids of the claimed events as stored, in claim order:
// what MarkPublished and Release take.
func IDs(claimed []events.Claimed) []any {
	out := make([]any, len(claimed))
	for i, c := range claimed {
		out[i] = c.ID
	}
	return out
}

// MessageIDs returns the _ids of the claimed events as message ids
// (testenv.MessageID), in claim order: strings a test sorts and compares.
func MessageIDs(claimed []events.Claimed) []string {
	out := make([]string, len(claimed))
	for i, c := range claimed {
		out[i] = testenv.MessageID(c.ID)
	}
	return out
}
