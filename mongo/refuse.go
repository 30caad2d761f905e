package mongo

import (
	"context"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/metrics"
)

// refusal is an event a claim read and will not claim.
type refusal struct {
	id        any
	lastError string
	large     bool // too close to the size limit: the FAIL write is kept small
	doc       bson.Raw
}

// fail writes each refused event FAILED, guarded by status NEW so that an
// event another worker claimed meanwhile is left alone, and never touching
// the field at fault. Events sharing a lastError share one write. A write
// that fails is reported in the event's Rejected.Err, never as the claim's
// error: the events claimed must still be relayed.
func (s *Store) fail(ctx context.Context, lease events.Lease, refused []refusal) []events.Rejected {
	if len(refused) == 0 {
		return nil
	}
	s.ahead.drop() // a refused event left NEW sorts before a read-ahead's
	out := make([]events.Rejected, 0, len(refused))
	groups := map[string][]any{}
	var order []string
	for _, r := range refused {
		switch {
		case r.id == nil:
			out = append(out, events.Rejected{LastError: r.lastError, Err: errors.New("no _id to write it by")})
		case r.large:
			out = append(out, s.failLarge(ctx, r))
		default:
			if _, ok := groups[r.lastError]; !ok {
				order = append(order, r.lastError)
			}
			groups[r.lastError] = append(groups[r.lastError], r.id)
		}
	}
	for _, lastError := range order {
		ids := groups[lastError]
		attempt := events.AttemptError{At: lease.At, WorkerID: lease.WorkerID, Reason: metrics.ReasonInvalid, Error: lastError}
		// skipped unset: a FAILED event that is not skipped holds its
		// aggregate, whatever a requeue of an earlier version left.
		update := withAttempt(bson.D{
			{Key: "$set", Value: failedSet(lastError, lease.At, attempt)},
			{Key: "$unset", Value: bson.D{{Key: events.FieldSkipped, Value: ""}}},
		}, &attempt)
		err := s.failIDs(ctx, ids, update)
		if err != nil && isDocumentError(err) && len(ids) > 1 {
			// One document spoiled the write: write them one by one.
			for _, id := range ids {
				out = append(out, events.Rejected{ID: id, LastError: lastError, Err: s.failIDs(ctx, []any{id}, update)})
			}
			continue
		}
		for _, id := range ids {
			out = append(out, events.Rejected{ID: id, LastError: lastError, Err: err})
		}
	}
	var written []any
	for _, r := range out {
		if r.Err == nil && r.ID != nil {
			written = append(written, r.ID)
		}
	}
	if len(written) > 0 {
		s.trimAttempts(ctx, byIDs(written))
	}
	return out
}

// failIDs applies update, a FAILED write, to the events of ids still NEW.
func (s *Store) failIDs(ctx context.Context, ids []any, update bson.D) error {
	filter := bson.D{
		{Key: events.FieldStatus, Value: events.StatusNew},
		{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: ids}}},
	}
	if _, err := s.coll.UpdateMany(ctx, filter, update); err != nil {
		return fmt.Errorf("mark %d events failed: %w", len(ids), err)
	}
	return nil
}

// failLarge writes FAILED to an event too close to the size limit with
// the smallest writes that say so: the status and a short lastError (about
// 150 bytes more), or where even that does not fit, the status alone (3
// bytes more than NEW). Where nothing fits, the event is left NEW and this
// store skips it from then on.
func (s *Store) failLarge(ctx context.Context, r refusal) events.Rejected {
	rej := events.Rejected{ID: r.id, LastError: r.lastError}
	status := bson.E{Key: events.FieldStatus, Value: events.StatusFailed}
	err := s.failIDs(ctx, []any{r.id}, setOnly(status, bson.E{Key: events.FieldLastError, Value: r.lastError}))
	if err == nil || !isDocumentError(err) {
		rej.Err = err
		return rej
	}
	if err = s.failIDs(ctx, []any{r.id}, setOnly(status)); err == nil || !isDocumentError(err) {
		rej.Err = err
		return rej
	}
	rej.Err = fmt.Errorf("no write fits under the document size limit: %w", err)
	key, _ := events.OrderingKey(r.doc)
	rej.Skipped = s.skipped.add(r.id, key)
	return rej
}

// isDocumentError reports an error about a document the server refused to
// change, as opposed to a network error, a timeout or an outage, after
// which the same write may well succeed.
func isDocumentError(err error) bool {
	if err == nil || mongo.IsNetworkError(err) || mongo.IsTimeout(err) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var we mongo.WriteException
	if errors.As(err, &we) {
		return len(we.WriteErrors) > 0 && we.WriteConcernError == nil
	}
	var ce mongo.CommandError
	if errors.As(err, &ce) {
		switch ce.Code {
		case 2, // BadValue
			14,    // TypeMismatch
			52,    // DollarPrefixedFieldName
			66,    // ImmutableField
			121,   // DocumentValidationFailure
			10334, // BSONObjectTooLarge
			17419: // the document after an update would be too large
			return true
		}
	}
	return false
}
