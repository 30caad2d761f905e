package mongo

import (
	"context"
	"errors"
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
	// ID is the record's _id, set by StartAction.
	ID bson.ObjectID `bson:"_id,omitempty" json:"id,omitzero"`
	At time.Time     `bson:"at" json:"at"`
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
	// Outbox names the outbox acted on, as the fleet file names it: the
	// record sits in that outbox's own audit collection, and says so
	// when it is read, exported or shown apart from it. "" for the one
	// outbox of a worker without a fleet file.
	Outbox string `bson:"outbox,omitempty" json:"outbox,omitempty"`
	// Schema is the record's schema version, which RecordAction sets
	// (SchemaVersion); 0 in records written before it existed.
	Schema int `bson:"schema,omitempty" json:"-"`
	// From is where the request came from: the client's address as the
	// console saw it.
	From string `bson:"from,omitempty" json:"from,omitempty"`
	// State is ActionStarted from the moment the action is about to
	// change something, then ActionDone, ActionFailed or
	// ActionCancelled with the real Count. A record left started is an
	// action whose end was never written (its process died).
	State string `bson:"state,omitempty" json:"state,omitempty"`
	// Error says why an action failed or stopped part way.
	Error string `bson:"error,omitempty" json:"error,omitempty"`
	// Ended is when the action ended; zero while it runs.
	Ended time.Time `bson:"endedAt,omitzero" json:"endedAt,omitzero"`
	// IDs are the _ids, as stored, of every event a console action set
	// out to change (its preview's, at most the console's ActionMax),
	// all of them. The events it did change carry the record's ID in
	// FieldActions (Store.Touched). Actions leaves them out; ActionByID
	// reads them.
	IDs []any `bson:"ids,omitempty" json:"-"`
	// Planned is how many events the action set out to change: with
	// Count, whether it was applied in full.
	Planned int `bson:"planned,omitempty" json:"planned,omitempty"`
}

// The states of an audited action.
const (
	ActionStarted   = "started"
	ActionDone      = "done"
	ActionFailed    = "failed"
	ActionCancelled = "cancelled"
)

// audit names the audit collection next to the outbox collection.
func (s *Store) audit() string { return s.coll.Name() + AuditSuffix }

// RecordAction adds a, an action already done, to the audit collection,
// its free text bounded.
func (s *Store) RecordAction(ctx context.Context, a Action) error {
	if a.State == "" {
		a.State, a.Ended = ActionDone, a.At
	}
	_, err := s.insertAction(ctx, a)
	return err
}

// StartAction records the intent of a before it changes anything, as
// started with a count of 0, and returns the record's id for
// FinishAction. An action whose intent cannot be recorded must not run.
func (s *Store) StartAction(ctx context.Context, a Action) (bson.ObjectID, error) {
	a.State, a.Count, a.Ended = ActionStarted, 0, time.Time{}
	return s.insertAction(ctx, a)
}

func (s *Store) insertAction(ctx context.Context, a Action) (bson.ObjectID, error) {
	a.ID = bson.NewObjectID()
	a.At = a.At.UTC().Truncate(time.Millisecond)
	a.By, a.Reason, a.Target = truncateError(a.By), truncateError(a.Reason), truncateError(a.Target)
	a.Schema = SchemaVersion
	if _, err := s.coll.Database().Collection(s.audit()).InsertOne(ctx, a); err != nil {
		return bson.ObjectID{}, fmt.Errorf("record the %s of %d events in %s: %w", a.Name, a.Count, s.audit(), err)
	}
	return a.ID, nil
}

// ProgressAction writes the count an action has changed so far, so that
// a record whose end is never written still says it.
func (s *Store) ProgressAction(ctx context.Context, id bson.ObjectID, count int) error {
	_, err := s.coll.Database().Collection(s.audit()).UpdateOne(ctx,
		bson.D{{Key: "_id", Value: id}, {Key: "state", Value: ActionStarted}},
		setOnly(bson.E{Key: "count", Value: count}))
	if err != nil {
		return fmt.Errorf("write the progress of action %s in %s: %w", id.Hex(), s.audit(), err)
	}
	return nil
}

// FinishAction completes the record StartAction wrote with how it ended:
// state, the events it changed in all, and errText when it failed or was
// cancelled.
func (s *Store) FinishAction(ctx context.Context, id bson.ObjectID, state string, count int, errText string, at time.Time) error {
	_, err := s.coll.Database().Collection(s.audit()).UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, setOnly(
		bson.E{Key: "state", Value: state}, bson.E{Key: "count", Value: count},
		bson.E{Key: "error", Value: truncateError(errText)}, bson.E{Key: "endedAt", Value: at.UTC().Truncate(time.Millisecond)},
	))
	if err != nil {
		return fmt.Errorf("complete the record of action %s in %s: %w", id.Hex(), s.audit(), err)
	}
	return nil
}

// Actions returns the last limit actions, newest first.
func (s *Store) Actions(ctx context.Context, limit int) ([]Action, error) {
	cur, err := s.coll.Database().Collection(s.audit()).Find(ctx, bson.D{},
		options.Find().SetSort(bson.D{{Key: "at", Value: -1}, {Key: "_id", Value: -1}}).SetLimit(int64(limit)).
			SetProjection(bson.D{{Key: "ids", Value: 0}}))
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

// ErrNoAction is ActionByID's error when no record has the id asked for.
var ErrNoAction = errors.New("no such action")

// ActionByID returns the audit record id, with the ids of every event it
// set out to change, or an error that wraps ErrNoAction.
func (s *Store) ActionByID(ctx context.Context, id bson.ObjectID) (Action, error) {
	var a Action
	err := s.coll.Database().Collection(s.audit()).FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&a)
	if isNoDocuments(err) {
		return Action{}, fmt.Errorf("%w: no action %s in %s", ErrNoAction, id.Hex(), s.audit())
	}
	if err != nil {
		return Action{}, fmt.Errorf("read action %s in %s: %w", id.Hex(), s.audit(), err)
	}
	if err := checkSchema(s.audit(), a.At, a.Schema); err != nil {
		return Action{}, err
	}
	return a, nil
}
