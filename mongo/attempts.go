package mongo

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
)

// withAttempt adds a to update's attempt history, bounded, keeping the
// last events.AttemptErrorsKept entries. Without a it is update.
func withAttempt(update bson.D, a *events.AttemptError) bson.D {
	if a == nil {
		return update
	}
	// Clipped, so that the $push never lands in spare room of update's
	// array that another caller's update shares (perWorker reuses one).
	return append(slices.Clip(update), bson.E{Key: "$push", Value: bson.D{{Key: events.FieldAttemptErrors, Value: bson.D{
		{Key: "$each", Value: bson.A{a.Bounded()}},
		{Key: "$slice", Value: -events.AttemptErrorsKept},
	}}}})
}

// trimAttempts drops the oldest entry of each history that holds more
// than events.AttemptErrorsKept, of the events filter matches, after a
// write to them that added one, where $slice does nothing
// (Store.ferret). filter narrows the trim to those events: on
// FerretDB it is a pass over what it matches. Each write adds one entry, so
// one pop a write keeps the bound. A trim that fails is logged: the
// history is one entry long until the next trims it, and the write it
// follows has landed.
func (s *Store) trimAttempts(ctx context.Context, filter bson.D) {
	if !s.ferret {
		return
	}
	filter = append(slices.Clone(filter),
		bson.E{Key: events.FieldAttemptErrors + "." + strconv.Itoa(events.AttemptErrorsKept), Value: bson.D{{Key: "$exists", Value: true}}})
	update := bson.D{{Key: "$pop", Value: bson.D{{Key: events.FieldAttemptErrors, Value: -1}}}}
	if _, err := s.coll.UpdateMany(ctx, filter, update); err != nil {
		s.logger.Warn("could not trim attempt histories", "error", fmt.Errorf("trim attempt histories: %w", err))
	}
}

// byIDs matches the events of ids.
func byIDs(ids []any) bson.D {
	return bson.D{{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: ids}}}}
}
