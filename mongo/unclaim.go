package mongo

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
)

// When a claim's write wins fewer events than its read returned, what it
// won may include a later event of an aggregate whose earlier event it did
// not: another worker's write took that one first (on FerretDB two
// guarded updates can both read an event as NEW), recovery or an operator
// moved it, or the server refused it. The later event must then wait:
// published now, it would go before the earlier one.

// lostAt returns, for each ordering key, the first event of it that the
// claim read (docs) and neither won (claimed) nor failed itself
// (refused, where a FAILED event does not hold its key): another write
// took it. Only with limit.Ordered.
func lostAt(docs []bson.Raw, claimed []events.Claimed, refused []refusal, limit events.ClaimLimit) map[string]bson.Raw {
	if !limit.Ordered {
		return nil
	}
	done := map[string]bool{}
	for _, c := range claimed {
		done[idKey(c.Doc)] = true
	}
	if !limit.FailedHolds {
		for _, r := range refused {
			done[idKey(r.doc)] = true
		}
	}
	var lost map[string]bson.Raw
	for _, doc := range docs {
		key, ok := events.OrderingKey(doc)
		if !ok || done[idKey(doc)] {
			continue
		}
		if lost == nil {
			lost = map[string]bson.Raw{}
		}
		if at := lost[key]; at == nil || events.CompareInKey(doc, at) < 0 {
			lost[key] = doc
		}
	}
	return lost
}

// unclaimBehind puts back to NEW, attempt refunded, the claimed events that
// sort after the event of their key the claim did not win (by sequence
// where both carry one, events.CompareInKey), and returns the events kept.
func (s *Store) unclaimBehind(ctx context.Context, lease events.Lease, claimed []events.Claimed, refusedAt map[string]bson.Raw) ([]events.Claimed, error) {
	if len(refusedAt) == 0 {
		return claimed, nil
	}
	s.ahead.drop() // what it puts back sorts before a read-ahead's
	kept := claimed[:0]
	var behind []any
	for _, c := range claimed {
		if key, ok := events.OrderingKey(c.Doc); ok && refusedAt[key] != nil && events.CompareInKey(c.Doc, refusedAt[key]) > 0 {
			behind = append(behind, c.ID)
			continue
		}
		kept = append(kept, c)
	}
	if len(behind) == 0 {
		return kept, nil
	}
	if _, err := s.coll.UpdateMany(ctx, leaseFilter(lease, behind), unclaimUpdate); err != nil {
		return nil, fmt.Errorf("put back %d events behind one the claim did not win: %w", len(behind), err)
	}
	return kept, nil
}

// findLeased reads back what lease holds: the events a claim that did not
// win all it read won.
func (s *Store) findLeased(ctx context.Context, lease events.Lease, limit int) ([]events.Claimed, error) {
	filter := bson.D{
		{Key: events.FieldStatus, Value: events.StatusProcessing},
		{Key: events.FieldClaimToken, Value: lease.Token},
		{Key: events.FieldWorkerID, Value: lease.WorkerID},
	}
	opts := options.Find().SetBatchSize(s.findBatch(limit))
	cur, err := s.coll.Find(ctx, filter, opts)
	if err != nil {
		return nil, fmt.Errorf("find claimed events: %w", err)
	}
	defer closeCursor(ctx, cur)
	var out []events.Claimed
	for cur.Next(ctx) {
		doc := make(bson.Raw, len(cur.Current))
		copy(doc, cur.Current)
		out = append(out, claimed(doc))
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("read claimed events: %w", err)
	}
	return out, nil
}
