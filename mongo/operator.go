package mongo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
)

// The operator's tools: requeue, skip, discard and show (Find) a FAILED
// event, and cut short the backoff of a NEW one (RetryNow).

// RequeueFilter chooses FAILED events to move back to NEW. At least one of
// IDs, Selected, Type and All must be set; All chooses every FAILED
// event. A skipped event is requeued only when IDs names it and nothing
// else narrows the choice: an operator skipped it on purpose, and a
// filter or a group that took it back would publish it after later
// events of its aggregate went out.
type RequeueFilter struct {
	IDs  []string
	Type string
	// Selected are the _ids, as stored, of the events a console preview
	// showed (Store.Select): the requeue acts on them and no other.
	Selected []any
	All      bool
	// PerSecond, when more than 0, spreads the requeued events over
	// time, oldest first, PerSecond of them due each second (a retryAt a
	// second apart per chunk from Now), so that requeueing thousands does
	// not flood the relay and its consumers at once. Each chunk is one
	// write.
	PerSecond int
	// Now is the database's time, from which PerSecond's spread counts.
	Now time.Time
	// Progress, when set, is told the events requeued so far after each
	// write, so that a requeue cut short still says what it did.
	Progress func(done int)
	// Action, when set, is the audit record of this requeue: every event
	// it moves is stamped with it (FieldActions), so that the events one
	// action moved are one query, and a requeue cut short is recounted.
	Action bson.ObjectID
}

// FieldActions is the events' field that lists the audit records
// (Action.ID) of the console actions that changed them: requeued or
// skipped them.
const FieldActions = "operatorActions"

// stamp is the update that adds action to an event's FieldActions, or
// nothing for a zero action.
func stamp(action bson.ObjectID) bson.E {
	if action.IsZero() {
		return bson.E{}
	}
	return bson.E{Key: "$addToSet", Value: bson.D{{Key: FieldActions, Value: action}}}
}

// withStamp adds action's stamp to update.
func withStamp(update bson.D, action bson.ObjectID) bson.D {
	if e := stamp(action); e.Key != "" {
		return append(update, e)
	}
	return update
}

// ErrNotAnID is the error of a selection that holds a value an event's
// _id cannot be: a regular expression, a document, an array, null.
var ErrNotAnID = errors.New("not an event id")

// idValues checks that ids are values an _id can be, matched by
// equality: a string, an ObjectID, a number or binary data (a UUID).
// Anything else in an $in would match by pattern or by type (a regular
// expression matches every string).
func idValues(ids []any) (bson.A, error) {
	out := make(bson.A, 0, len(ids))
	for i, id := range ids {
		switch id.(type) {
		case string, bson.ObjectID, int32, int64, int, float64, bson.Binary, bson.Decimal128:
			out = append(out, id)
		default:
			return nil, fmt.Errorf("selection element %d is a %T: %w", i, id, ErrNotAnID)
		}
	}
	return out, nil
}

// IDCandidates are the values an id given as text may be stored as: the
// string itself, and the ObjectID it is the hex of.
func IDCandidates(id string) []any { return idCandidates([]string{id}) }

func (f RequeueFilter) query() (bson.D, error) {
	q := bson.D{{Key: events.FieldStatus, Value: events.StatusFailed}}
	if len(f.IDs) == 0 && f.Type == "" && len(f.Selected) == 0 && !f.All {
		return nil, fmt.Errorf("requeue needs --id, --type or --all")
	}
	if len(f.IDs) == 0 || f.Type != "" || len(f.Selected) > 0 || f.All {
		q = append(q, bson.E{Key: events.FieldSkippedAt, Value: nil})
	}
	// A discarded event is never requeued, not even by its id: an
	// operator decided it is not to be published.
	q = append(q, bson.E{Key: events.FieldDiscardedAt, Value: nil})
	if len(f.IDs) > 0 {
		q = append(q, bson.E{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: idCandidates(f.IDs)}}})
	}
	if len(f.Selected) > 0 {
		ids, err := idValues(f.Selected)
		if err != nil {
			return nil, fmt.Errorf("requeue the selected events: %w", err)
		}
		q = append(q, bson.E{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: ids}}})
	}
	if f.Type != "" {
		q = append(q, bson.E{Key: events.FieldType, Value: f.Type})
	}
	return q, nil
}

// idCandidates matches an id given on a command line whether the event
// stored it as an ObjectID or as a string.
func idCandidates(ids []string) []any {
	out := make([]any, 0, 2*len(ids))
	for _, id := range ids {
		out = append(out, id)
		if oid, err := bson.ObjectIDFromHex(id); err == nil {
			out = append(out, oid)
		}
	}
	return out
}

// Requeue moves the FAILED events f chooses back to NEW with a fresh set of
// attempts, keeping lastError for the record. With dryRun it only counts
// them.
func (s *Store) Requeue(ctx context.Context, f RequeueFilter, dryRun bool) (int, error) {
	q, err := f.query()
	if err != nil {
		return 0, err
	}
	if dryRun {
		n, err := s.coll.CountDocuments(ctx, q)
		if err != nil {
			return 0, fmt.Errorf("count events to requeue: %w", err)
		}
		return int(n), nil
	}
	update := withStamp(requeueUpdate(time.Time{}), f.Action)
	if f.PerSecond > 0 {
		return s.requeueSpread(ctx, q, f)
	}
	end := s.failedTurn()
	res, err := s.coll.UpdateMany(ctx, q, update)
	end()
	if err != nil {
		return 0, fmt.Errorf("requeue events: %w", err)
	}
	f.progress(int(res.ModifiedCount))
	return int(res.ModifiedCount), nil
}

func (f RequeueFilter) progress(done int) {
	if f.Progress != nil {
		f.Progress(done)
	}
}

// requeueSpread requeues the events q matches f.PerSecond at a time,
// oldest first, the k-th chunk due k seconds after f.Now. Events of one
// aggregate come due in their order, and an event not yet due holds its
// aggregate as any event backing off does.
func (s *Store) requeueSpread(ctx context.Context, q bson.D, f RequeueFilter) (int, error) {
	cur, err := s.timedFind(ctx, findCommand{
		filter: q, sort: bson.D{{Key: events.FieldCreatedAt, Value: 1}, {Key: events.FieldID, Value: 1}},
		projection: bson.D{{Key: events.FieldID, Value: 1}},
	})
	if err != nil {
		return 0, fmt.Errorf("list events to requeue: %w", err)
	}
	docs, err := rawAll(ctx, cur)
	if err != nil {
		return 0, fmt.Errorf("list events to requeue: %w", err)
	}
	total := 0
	for k := 0; k*f.PerSecond < len(docs); k++ {
		chunk := docs[k*f.PerSecond : min((k+1)*f.PerSecond, len(docs))]
		ids := make(bson.A, len(chunk))
		for i, d := range chunk {
			ids[i] = d.Lookup(events.FieldID)
		}
		var due time.Time
		if k > 0 {
			due = f.Now.Add(time.Duration(k) * time.Second).UTC().Truncate(time.Millisecond)
		}
		// The chunk's ids were read by q: its other conditions are
		// checked again, its own _id condition gives way to the chunk's.
		filter := slices.DeleteFunc(slices.Clone(q), func(e bson.E) bool { return e.Key == events.FieldID })
		filter = append(filter, bson.E{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: ids}}})
		end := s.failedTurn()
		res, err := s.coll.UpdateMany(ctx, filter, withStamp(requeueUpdate(due), f.Action))
		end()
		if err != nil {
			return total, fmt.Errorf("requeue events (%d done): %w", total, err)
		}
		total += int(res.ModifiedCount)
		f.progress(total)
	}
	return total, nil
}

// requeueUpdate moves a FAILED event back to NEW with a fresh set of
// attempts, due at once, or at due when it is not zero. lastError stays,
// for the record.
func requeueUpdate(due time.Time) bson.D {
	set := bson.D{
		{Key: events.FieldStatus, Value: events.StatusNew},
		{Key: events.FieldAttempts, Value: 0},
	}
	unset := bson.D{
		{Key: events.FieldWorkerID, Value: ""},
		{Key: events.FieldProcessingAt, Value: ""},
		{Key: events.FieldClaimToken, Value: ""},
		{Key: events.FieldFailedAt, Value: ""},
		// A requeued event is no longer skipped: it holds its aggregate
		// again until it is published.
		{Key: events.FieldSkippedBy, Value: ""},
		{Key: events.FieldSkippedAt, Value: ""},
		{Key: events.FieldSkipReason, Value: ""},
		{Key: events.FieldSkipped, Value: ""},
		// Its cause is that of this failure; the next is classified
		// anew.
		{Key: events.FieldFailureCause, Value: ""},
		{Key: events.FieldFailureReason, Value: ""},
	}
	if due.IsZero() {
		unset = append(unset, bson.E{Key: events.FieldRetryAt, Value: ""})
	} else {
		set = append(set, bson.E{Key: events.FieldRetryAt, Value: due})
	}
	return bson.D{{Key: "$set", Value: set}, {Key: "$unset", Value: unset}}
}

// RetryNow makes the NEW events f names by id (and, when f.Type is set, of
// that type) that are backing off before a retry due at once: it unsets
// their retryAt, which is all that keeps them, and the later events of
// their aggregates, from the next claim. Attempts and lastError stay: the
// event keeps counting towards its last attempt. Only NEW events with a
// retryAt are touched, so naming another is harmless; f.All is ignored,
// since a backoff is the relay's own and is only cut short by name. With
// dryRun it only counts them.
func (s *Store) RetryNow(ctx context.Context, f RequeueFilter, dryRun bool) (int, error) {
	if len(f.IDs) == 0 {
		return 0, nil
	}
	q := bson.D{
		{Key: events.FieldStatus, Value: events.StatusNew},
		{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: idCandidates(f.IDs)}}},
		{Key: events.FieldRetryAt, Value: bson.D{{Key: "$exists", Value: true}}},
	}
	if f.Type != "" {
		q = append(q, bson.E{Key: events.FieldType, Value: f.Type})
	}
	if dryRun {
		n, err := s.coll.CountDocuments(ctx, q)
		if err != nil {
			return 0, fmt.Errorf("count events to retry now: %w", err)
		}
		return int(n), nil
	}
	res, err := s.coll.UpdateMany(ctx, q, bson.D{{Key: "$unset", Value: bson.D{{Key: events.FieldRetryAt, Value: ""}}}})
	if err != nil {
		return 0, fmt.Errorf("retry events now: %w", err)
	}
	return int(res.ModifiedCount), nil
}

// ErrNoEvent is Find's error when no event has the _id asked for.
var ErrNoEvent = errors.New("no such event")

// Find returns the event whose _id is id (as a string or an ObjectID's
// hex), or an error that wraps ErrNoEvent.
// Each candidate is looked up by equality, which FerretDB hands to its
// backend, where an $in of them would decode the whole collection.
func (s *Store) Find(ctx context.Context, id string) (bson.Raw, error) {
	candidates := idCandidates([]string{id})
	slices.Reverse(candidates) // an ObjectID's hex is most likely an ObjectID
	for _, candidate := range candidates {
		raw, err := s.coll.FindOne(ctx, bson.D{{Key: events.FieldID, Value: candidate}}).Raw()
		if isNoDocuments(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("find event %q: %w", id, err)
		}
		return raw, nil
	}
	return nil, fmt.Errorf("%w: no event with _id %q", ErrNoEvent, id)
}

// SkipSelected marks skipped the FAILED events of a console preview's
// selection, their _ids as stored, that are not skipped yet, as Skip
// does, and stamps each with action, the audit record of the skip
// (FieldActions; none when zero). An id that is no _id value (a regular
// expression, a document) refuses the whole selection (ErrNotAnID).
func (s *Store) SkipSelected(ctx context.Context, ids []any, by, reason string, at time.Time, action bson.ObjectID) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	values, err := idValues(ids)
	if err != nil {
		return 0, fmt.Errorf("skip the selected events: %w", err)
	}
	return s.skip(ctx, bson.D{
		{Key: events.FieldStatus, Value: events.StatusFailed},
		{Key: events.FieldSkippedAt, Value: nil},
		{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: values}}},
	}, by, reason, at, action)
}

// Touched returns those of ids (as stored) whose events carry action's
// stamp (FieldActions): the events an action changed, read back from the
// events themselves, so an action whose write failed half way is counted
// by what it did, not by what its write answered. ids bound the read to
// the _id index.
func (s *Store) Touched(ctx context.Context, action bson.ObjectID, ids []any) ([]any, error) {
	if len(ids) == 0 || action.IsZero() {
		return nil, nil
	}
	values, err := idValues(ids)
	if err != nil {
		return nil, fmt.Errorf("read the events of action %s: %w", action.Hex(), err)
	}
	cur, err := s.timedFind(ctx, findCommand{
		filter: bson.D{
			{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: values}}},
			{Key: FieldActions, Value: action},
		},
		sort:       bson.D{{Key: events.FieldCreatedAt, Value: 1}, {Key: events.FieldID, Value: 1}},
		projection: bson.D{{Key: events.FieldID, Value: 1}},
	})
	if err != nil {
		return nil, fmt.Errorf("read the events of action %s: %w", action.Hex(), err)
	}
	docs, err := rawAll(ctx, cur)
	if err != nil {
		return nil, fmt.Errorf("read the events of action %s: %w", action.Hex(), err)
	}
	out := make([]any, 0, len(docs))
	for _, d := range docs {
		var id any
		if err := d.Lookup(events.FieldID).Unmarshal(&id); err != nil {
			return nil, fmt.Errorf("read the events of action %s: %w", action.Hex(), err)
		}
		out = append(out, id)
	}
	return out, nil
}

// Skip marks the FAILED events named by ids (string or ObjectID hex) as
// skipped by an operator: status stays FAILED, and skippedBy, skippedAt
// and skipReason record who, when and why, so that the later events of
// their aggregates flow. An event already skipped keeps its first record.
// With dryRun it only counts them. Only FAILED events can be skipped.
func (s *Store) Skip(ctx context.Context, ids []string, by, reason string, at time.Time, dryRun bool) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	filter := bson.D{
		{Key: events.FieldStatus, Value: events.StatusFailed},
		{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: idCandidates(ids)}}},
		{Key: events.FieldSkippedAt, Value: bson.D{{Key: "$exists", Value: false}}},
	}
	if dryRun {
		n, err := s.coll.CountDocuments(ctx, filter)
		if err != nil {
			return 0, fmt.Errorf("count events to skip: %w", err)
		}
		return int(n), nil
	}
	return s.skip(ctx, filter, by, reason, at, bson.ObjectID{})
}

// skip marks the events filter matches skipped by, at, for reason, each
// stamped with action when it is not zero.
func (s *Store) skip(ctx context.Context, filter bson.D, by, reason string, at time.Time, action bson.ObjectID) (int, error) {
	defer s.failedTurn()()
	res, err := s.coll.UpdateMany(ctx, filter, withStamp(bson.D{{Key: "$set", Value: bson.D{
		{Key: events.FieldSkippedBy, Value: by},
		{Key: events.FieldSkippedAt, Value: at.UTC().Truncate(time.Millisecond)},
		{Key: events.FieldSkipReason, Value: truncateError(reason)},
		{Key: events.FieldSkipped, Value: true},
	}}}, action))
	if err != nil {
		return 0, fmt.Errorf("skip events: %w", err)
	}
	return int(res.ModifiedCount), nil
}

// Discard marks the FAILED events named by ids (string or ObjectID hex)
// discarded by an operator, as DiscardSelected does, unstamped. With
// dryRun it only counts those it would discard.
func (s *Store) Discard(ctx context.Context, ids []string, by, reason string, at time.Time, dryRun bool) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	in := bson.E{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: idCandidates(ids)}}}
	if dryRun {
		n, err := s.coll.CountDocuments(ctx, discardable(in))
		if err != nil {
			return 0, fmt.Errorf("count events to discard: %w", err)
		}
		return int(n), nil
	}
	return s.discard(ctx, in, by, reason, at, bson.ObjectID{})
}

// DiscardSelected marks discarded the FAILED events of ids, their _ids
// as stored, that are not discarded yet, and stamps each with action
// (none when zero). A discard is a skip that cannot be undone: the
// event stays FAILED and is kept, for the record, with discardedBy,
// discardedAt and discardReason; its aggregate's later events flow (an
// event not yet skipped is skipped by the same hand; one skipped before
// keeps that skip's record); and no requeue takes it back. An id that is
// no _id value refuses the whole selection (ErrNotAnID).
func (s *Store) DiscardSelected(ctx context.Context, ids []any, by, reason string, at time.Time, action bson.ObjectID) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	values, err := idValues(ids)
	if err != nil {
		return 0, fmt.Errorf("discard the selected events: %w", err)
	}
	return s.discard(ctx, bson.E{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: values}}}, by, reason, at, action)
}

// discardable is the filter of the FAILED events in that are not
// discarded yet.
func discardable(in bson.E) bson.D {
	return bson.D{
		{Key: events.FieldStatus, Value: events.StatusFailed},
		{Key: events.FieldDiscardedAt, Value: nil},
		in,
	}
}

// discard skips the events of in that are FAILED and neither skipped nor
// discarded, then marks every FAILED one not yet discarded discarded.
// The skip comes first: a process that dies between the two leaves
// events skipped, which a requeue by id can still undo, never an event
// marked discarded that still holds its aggregate. Both writes stamp
// action, so that a discard cut short is recounted by its stamp.
func (s *Store) discard(ctx context.Context, in bson.E, by, reason string, at time.Time, action bson.ObjectID) (int, error) {
	at = at.UTC().Truncate(time.Millisecond)
	reason = truncateError(reason)
	defer s.failedTurn()()
	if _, err := s.coll.UpdateMany(ctx, append(discardable(in), bson.E{Key: events.FieldSkippedAt, Value: nil}),
		withStamp(bson.D{{Key: "$set", Value: bson.D{
			{Key: events.FieldSkippedBy, Value: by},
			{Key: events.FieldSkippedAt, Value: at},
			{Key: events.FieldSkipReason, Value: reason},
			{Key: events.FieldSkipped, Value: true},
		}}}, action)); err != nil {
		return 0, fmt.Errorf("discard events: skip them: %w", err)
	}
	res, err := s.coll.UpdateMany(ctx, discardable(in), withStamp(bson.D{{Key: "$set", Value: bson.D{
		{Key: events.FieldDiscardedBy, Value: by},
		{Key: events.FieldDiscardedAt, Value: at},
		{Key: events.FieldDiscardReason, Value: reason},
		// Set as a skip sets it, for an event skipped before skipped
		// was written: the claims' read of the FAILED keys leaves it
		// out on the server.
		{Key: events.FieldSkipped, Value: true},
	}}}, action))
	if err != nil {
		return 0, fmt.Errorf("discard events: %w", err)
	}
	return int(res.ModifiedCount), nil
}
