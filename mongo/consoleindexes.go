package mongo

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
)

// The console's indexes. Only the console needs them: EnsureBrowseIndex
// creates them, not Prepare, for each costs every write of an event's
// status one more index key, which is why the worker does not create
// them. Each lets a page read what it shows, not the range of a status
// it filters: the PUBLISHED history of a real outbox is millions.
const (
	// browseIndex orders the events of a status newest first with the
	// _id tiebreak of events created in the same millisecond, so that a
	// page is a range of index keys and the next one starts where it
	// ended.
	browseIndex = "outbox_browse"
	// typeIndex and aggregateIndex are the same within one type or one
	// aggregate id: a rare type among millions of PUBLISHED events is
	// a short range, not a walk of the status.
	typeIndex      = "outbox_browse_type"
	aggregateIndex = "outbox_browse_aggregate"
	// failureIndex holds the FAILED events by stored cause and reason
	// (ClassifyFailed): the events not classified yet, a group's events
	// and its selection are ranges of it.
	failureIndex = "outbox_failure_cause"
	// auditIndex orders the audit newest first: the audit page reads
	// the last actions, never sorts the collection.
	auditIndex = "outbox_audit_at"
)

// consoleIndexes are the console's indexes on the outbox collection.
var consoleIndexes = []struct {
	name string
	keys bson.D
}{
	{browseIndex, bson.D{{Key: events.FieldStatus, Value: 1}, {Key: events.FieldCreatedAt, Value: 1}, {Key: events.FieldID, Value: 1}}},
	{typeIndex, bson.D{{Key: events.FieldStatus, Value: 1}, {Key: events.FieldType, Value: 1}, {Key: events.FieldCreatedAt, Value: 1}, {Key: events.FieldID, Value: 1}}},
	{aggregateIndex, bson.D{{Key: events.FieldStatus, Value: 1}, {Key: events.FieldAggregateID, Value: 1}, {Key: events.FieldCreatedAt, Value: 1}, {Key: events.FieldID, Value: 1}}},
	{failureIndex, bson.D{
		{Key: events.FieldStatus, Value: 1}, {Key: events.FieldFailureCause, Value: 1}, {Key: events.FieldFailureReason, Value: 1},
		{Key: events.FieldCreatedAt, Value: 1}, {Key: events.FieldID, Value: 1},
	}},
}

// EnsureBrowseIndex creates the console's indexes that are missing, one
// per command (see ensureIndexes), and the audit's.
func (s *Store) EnsureBrowseIndex(ctx context.Context) error {
	existing, err := s.indexNames(ctx)
	if err != nil {
		return err
	}
	for _, ix := range consoleIndexes {
		if existing[ix.name] {
			continue
		}
		if _, err := s.coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: ix.keys, Options: options.Index().SetName(ix.name)}); err != nil {
			return fmt.Errorf("create index %s on %s: %w", ix.name, s.coll.Name(), err)
		}
	}
	audit := s.coll.Database().Collection(s.audit())
	keys := bson.D{{Key: "at", Value: -1}, {Key: "_id", Value: -1}}
	if _, err := audit.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: keys, Options: options.Index().SetName(auditIndex)}); err != nil {
		return fmt.Errorf("create index %s on %s: %w", auditIndex, s.audit(), err)
	}
	return nil
}
