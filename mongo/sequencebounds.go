package mongo

import (
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
)

// seqBound is the range of versions a sequence check reads of the
// aggregates with one aggregateId: their PUBLISHED events from the lowest
// version in the batch, their NEW events below the highest.
type seqBound struct {
	id              string
	lowest, highest int64
}

// sequenceBounds gathers the bounds of the batch's sequenced aggregates
// by aggregateId, in the order the batch first names them. Aggregates of
// different types that share an id share one bound, the looser.
func sequenceBounds(keys []string, aggs map[string]*seqAggregate) []seqBound {
	var bounds []seqBound
	at := map[string]int{}
	for _, key := range keys {
		a := aggs[key]
		i, ok := at[a.id]
		if !ok {
			at[a.id] = len(bounds)
			bounds = append(bounds, seqBound{id: a.id, lowest: a.minBatch, highest: a.maxBatch})
			continue
		}
		bounds[i].lowest = min(bounds[i].lowest, a.minBatch)
		bounds[i].highest = max(bounds[i].highest, a.maxBatch)
	}
	return bounds
}

// orBoundsMax caps the clauses of a sequence check's $or: past it, one
// clause bounds every aggregate by the batch's extremes, which reads more
// history but keeps the query's size in step with the batch's.
const orBoundsMax = 1000

// sequenceFilter selects the events of status (PUBLISHED: at or above
// the lowest version; NEW: below the highest) of the aggregates bounds
// names. Where the server plans each clause of an $or on an index
// (MongoDB, the sequence index), each aggregate is bounded by its own
// versions, so that a new aggregate in the batch does not make the check
// read the retained history of the others. FerretDB matches an $or in Go
// against every event it decodes: there the filter is an equality on
// status (and on the aggregateId, where there is one), which it pushes
// down, and one bound for all.
func (s *Store) sequenceFilter(status events.Status, bounds []seqBound) bson.D {
	versions := func(b seqBound) bson.D {
		if status == events.StatusPublished {
			return bson.D{{Key: "$gte", Value: b.lowest}}
		}
		return bson.D{{Key: "$lt", Value: b.highest}}
	}
	if s.lane.boundsEach() && len(bounds) > 1 && len(bounds) <= orBoundsMax {
		clauses := make(bson.A, 0, len(bounds))
		for _, b := range bounds {
			clauses = append(clauses, bson.D{
				{Key: events.FieldStatus, Value: status},
				{Key: events.FieldAggregateID, Value: b.id},
				{Key: events.FieldSequence, Value: versions(b)},
			})
		}
		return bson.D{{Key: "$or", Value: clauses}}
	}
	all := seqBound{lowest: bounds[0].lowest, highest: bounds[0].highest}
	ids := make([]string, 0, len(bounds))
	for _, b := range bounds {
		all.lowest, all.highest = min(all.lowest, b.lowest), max(all.highest, b.highest)
		ids = append(ids, b.id)
	}
	f := bson.D{{Key: events.FieldStatus, Value: status}}
	if len(ids) == 1 {
		f = append(f, bson.E{Key: events.FieldAggregateID, Value: ids[0]})
	} else {
		f = append(f, bson.E{Key: events.FieldAggregateID, Value: bson.D{{Key: "$in", Value: ids}}})
	}
	return append(f, bson.E{Key: events.FieldSequence, Value: versions(all)})
}
