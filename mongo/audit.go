package mongo

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// AuditSuffix names the audit collection after the outbox collection:
// "<collection>_audit".
const AuditSuffix = "_audit"

// Action is one operator action on the outbox, as the audit collection
// records it: who did what, when, why, to which events and how many.
type Action struct {
	At time.Time `bson:"at" json:"at"`
	// By is who acted: the console's signed-in operator, or the CLI's
	// --by (default: the user running it).
	By string `bson:"by" json:"by"`
	// Name is requeue, skip, pause or resume.
	Name   string `bson:"action" json:"action"`
	Reason string `bson:"reason" json:"reason"`
	// Target says which events were chosen: ids, a type, a cause, all;
	// for pause and resume, the type.
	Target string `bson:"target" json:"target"`
	// Count is how many events the action changed; for pause and
	// resume, 1 (the type).
	Count int `bson:"count" json:"count"`
	// Source is "cli" or "console".
	Source string `bson:"source" json:"source"`
	// Schema is the record's schema version, which RecordAction sets
	// (SchemaVersion); 0 in records written before it existed.
	Schema int `bson:"schema,omitempty" json:"-"`
}

// audit names the audit collection next to the outbox collection.
func (s *Store) audit() string { return s.coll.Name() + AuditSuffix }

// RecordAction adds a to the audit collection, its free text bounded.
func (s *Store) RecordAction(ctx context.Context, a Action) error {
	a.At = a.At.UTC().Truncate(time.Millisecond)
	a.By, a.Reason, a.Target = truncateError(a.By), truncateError(a.Reason), truncateError(a.Target)
	a.Schema = SchemaVersion
	if _, err := s.coll.Database().Collection(s.audit()).InsertOne(ctx, a); err != nil {
		return fmt.Errorf("record the %s of %d events in %s: %w", a.Name, a.Count, s.audit(), err)
	}
	return nil
}

// Actions returns the last limit actions, newest first.
func (s *Store) Actions(ctx context.Context, limit int) ([]Action, error) {
	cur, err := s.coll.Database().Collection(s.audit()).Find(ctx, bson.D{},
		options.Find().SetSort(bson.D{{Key: "at", Value: -1}, {Key: "_id", Value: -1}}).SetLimit(int64(limit)))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", s.audit(), err)
	}
	var out []Action
	if err := cur.All(ctx, &out); err != nil {
		return nil, fmt.Errorf("read %s: %w", s.audit(), err)
	}
	for _, a := range out {
		if err := checkSchema(s.audit(), a.At, a.Schema); err != nil {
			return nil, err
		}
	}
	return out, nil
}
