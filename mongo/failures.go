package mongo

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
)

// The failure groups of the console: each FAILED event's cause is
// computed once, by ClassifyFailed, and stored on it
// (events.FieldFailureCause and events.FieldFailureReason), so that a
// group is a set of events chosen by equality, the same set whichever
// page or action reads it.

// unclassified matches the FAILED events whose cause is not stored yet.
func unclassified() bson.D {
	return bson.D{{Key: events.FieldStatus, Value: events.StatusFailed}, {Key: events.FieldFailureCause, Value: nil}}
}

// ClassifyFailed stores the cause of up to limit FAILED events that have
// none yet, and returns how many it classified. The cause is lastError
// normalized (events.Cause) and the reason of the last failed attempt.
// An event requeued meanwhile is left alone: the write is guarded by
// its status and by the cause still missing.
func (s *Store) ClassifyFailed(ctx context.Context, limit int) (int, error) {
	history := lastAttemptProjection(s.ferret)
	cur, err := s.timedFind(ctx, findCommand{
		filter:     unclassified(),
		projection: bson.D{{Key: events.FieldLastError, Value: 1}, {Key: events.FieldAttemptErrors, Value: history}},
		limit:      limit,
	})
	if err != nil {
		return 0, fmt.Errorf("read unclassified FAILED events: %w", err)
	}
	docs, err := rawAll(ctx, cur)
	if err != nil {
		return 0, fmt.Errorf("read unclassified FAILED events: %w", err)
	}
	return s.storeCauses(ctx, docs)
}

// storeCauses stores the cause of each of docs, FAILED events as
// ClassifyFailed or FailedSample project them, with one write per cause,
// and returns how many it stored. An event requeued or classified
// meanwhile is left alone: each write is guarded by its status and by
// the cause still missing.
func (s *Store) storeCauses(ctx context.Context, docs []bson.Raw) (int, error) {
	byGroup := map[failureKey]bson.A{}
	var order []failureKey
	for _, d := range docs {
		lastError, _ := d.Lookup(events.FieldLastError).StringValueOK()
		g := failureKey{reason: LastAttemptReason(d), cause: events.Cause(lastError)}
		if _, ok := byGroup[g]; !ok {
			order = append(order, g)
		}
		byGroup[g] = append(byGroup[g], d.Lookup(events.FieldID))
	}
	defer s.failedTurn()()
	total := 0
	for _, g := range order {
		filter := append(unclassified(), bson.E{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: byGroup[g]}}})
		res, err := s.coll.UpdateMany(ctx, filter, setOnly(
			bson.E{Key: events.FieldFailureCause, Value: truncateError(g.cause)},
			bson.E{Key: events.FieldFailureReason, Value: g.reason},
		))
		if err != nil {
			return total, fmt.Errorf("store the cause of %d FAILED events: %w", len(byGroup[g]), err)
		}
		total += int(res.ModifiedCount)
	}
	return total, nil
}

// failureFields are the stored cause and reason of an event failed with
// lastError on attempt, its last, for the write that fails it: a cause
// stored there needs no later write (storeCauses), which on FerretDB
// races the operators' requeues (Store.failedTurn).
func failureFields(lastError string, attempt events.AttemptError) []bson.E {
	// From lastError as stored (truncated), as storeCauses computes it,
	// so that an event lands in the same group either way.
	return []bson.E{
		{Key: events.FieldFailureCause, Value: truncateError(events.Cause(truncateError(lastError)))},
		{Key: events.FieldFailureReason, Value: attempt.Bounded().Reason},
	}
}

// failedSet is the $set of a write that fails an event at at with
// lastError on attempt, its last: the status, the error, when, and the
// failure group (failureFields).
func failedSet(lastError string, at time.Time, attempt events.AttemptError) bson.D {
	return append(bson.D{
		{Key: events.FieldStatus, Value: events.StatusFailed},
		{Key: events.FieldLastError, Value: truncateError(lastError)},
		{Key: events.FieldFailedAt, Value: at},
	}, failureFields(lastError, attempt)...)
}

// lastAttemptProjection projects an event's last failed attempt; FerretDB
// has no $slice projection, and gets the whole history, at most
// events.AttemptErrorsKept entries.
func lastAttemptProjection(ferret bool) any {
	if ferret {
		return 1
	}
	return bson.D{{Key: "$slice", Value: -1}}
}

// LastAttemptReason is the reason of an event's last failed attempt, ""
// where it has none.
func LastAttemptReason(doc bson.Raw) string {
	arr, ok := doc.Lookup(events.FieldAttemptErrors).ArrayOK()
	if !ok {
		return ""
	}
	values, err := arr.Values()
	if err != nil || len(values) == 0 {
		return ""
	}
	last, ok := values[len(values)-1].DocumentOK()
	if !ok {
		return ""
	}
	reason, _ := last.Lookup("reason").StringValueOK()
	return reason
}

// Group is a failure group: the FAILED events, not skipped, whose stored
// cause and reason are these.
type Group struct {
	Reason, Cause string
}

// Selection chooses the FAILED events a console action previews and then
// acts on. Skipped events are never chosen.
type Selection struct {
	// Group, when set, chooses the events of a failure group.
	Group *Group
	// Type, when set, chooses the events of a type.
	Type string
	// IDs, when set, chooses these events (string or ObjectID hex).
	IDs []string
}

func (sel Selection) filter() (bson.D, error) {
	if sel.Group == nil && sel.Type == "" && len(sel.IDs) == 0 {
		return nil, fmt.Errorf("select events: a group, a type or ids are required")
	}
	q := bson.D{{Key: events.FieldStatus, Value: events.StatusFailed}, {Key: events.FieldSkippedAt, Value: nil}}
	if g := sel.Group; g != nil {
		q = append(q, bson.E{Key: events.FieldFailureCause, Value: g.Cause}, bson.E{Key: events.FieldFailureReason, Value: g.Reason})
	}
	if sel.Type != "" {
		q = append(q, bson.E{Key: events.FieldType, Value: sel.Type})
	}
	if len(sel.IDs) > 0 {
		q = append(q, bson.E{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: idCandidates(sel.IDs)}}})
	}
	return q, nil
}

// Select returns the _ids of up to limit events sel chooses, oldest
// first, and how many it chooses in all.
func (s *Store) Select(ctx context.Context, sel Selection, limit int) ([]any, int, error) {
	q, err := sel.filter()
	if err != nil {
		return nil, 0, err
	}
	total, err := s.coll.CountDocuments(ctx, q)
	if err != nil {
		return nil, 0, fmt.Errorf("count the selected events: %w", err)
	}
	cur, err := s.timedFind(ctx, findCommand{
		filter: q, sort: bson.D{{Key: events.FieldCreatedAt, Value: 1}, {Key: events.FieldID, Value: 1}},
		projection: bson.D{{Key: events.FieldID, Value: 1}}, limit: limit,
	})
	if err != nil {
		return nil, 0, fmt.Errorf("list the selected events: %w", err)
	}
	docs, err := rawAll(ctx, cur)
	if err != nil {
		return nil, 0, fmt.Errorf("list the selected events: %w", err)
	}
	ids := make([]any, 0, len(docs))
	for _, d := range docs {
		var id any
		if err := d.Lookup(events.FieldID).Unmarshal(&id); err != nil {
			return nil, 0, fmt.Errorf("list the selected events: read an _id: %w", err)
		}
		ids = append(ids, id)
	}
	return ids, int(total), nil
}
