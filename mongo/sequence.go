package mongo

// Order by the aggregate's own version (events.FieldSequence): the claim's
// read goes by createdAt, which comes from the producers' clocks; where
// the events of an aggregate carry a sequence, a claim checks its batch
// against the aggregate's other unpublished events before it writes
// (docs/ordering.md, The sequence field).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
)

// seqEvent is one sequenced event a sequence check knows of.
type seqEvent struct {
	id  any
	seq int64
	doc bson.Raw
}

// seqAggregate is what a sequence check knows of one ordering key.
type seqAggregate struct {
	id       string     // aggregateId
	batch    []seqEvent // its sequenced events in the batch
	plain    int        // its events in the batch without a valid sequence
	missing  []seqEvent // its NEW events outside the batch below the batch's highest
	pulled   []bson.Raw // those taken into the batch
	blockAt  int64      // the lowest sequence it must wait for; -1: none
	maxBatch int64
	minBatch int64
}

// orderBySequence checks an ordered claim's batch, docs in claim order,
// against the other events of the aggregates whose batch events carry a
// sequence, and returns the batch to claim:
//
//   - an earlier version (a lower sequence) that is NEW, due and not
//     parked, but outside the read (a later createdAt: a producer's clock
//     behind), is taken into the batch, before its aggregate's events, up
//     to limit's count (and bytes) again;
//   - events above an earlier version that cannot be taken now (backing
//     off, parked, of a paused type, or past that bound) are left NEW, with everything after
//     them of their aggregate: a later claim takes them with or after it;
//   - each aggregate's sequenced events are put in sequence order in the
//     places they hold (events.SortBySequence).
//
// It counts the events it puts after an event of their aggregate with a
// later createdAt (events.SequenceReordered), and, without holding
// anything back, the events whose sequence is
// lower than (events.SequenceBehind) or equal to (events.SequenceRepeat)
// one already PUBLISHED of their aggregate or, for a repeat, another of
// the batch, and the aggregates that mix events with and without one
// (events.SequenceMixed). A batch without sequenced events costs nothing;
// one with them costs two projected finds (one on MongoDB's sequence
// index each, an equality on status on FerretDB), and a third where it
// takes events in.
func (s *Store) orderBySequence(ctx context.Context, now time.Time, limit events.ClaimLimit, docs []bson.Raw) ([]bson.Raw, error) {
	aggs, keys, inBatch := sequencedAggregates(docs)
	if len(aggs) == 0 {
		return docs, nil
	}
	bounds := sequenceBounds(keys, aggs)
	var published map[string][]int64
	var pubErr error
	pubRead := make(chan struct{})
	go func() {
		defer close(pubRead)
		published, pubErr = s.publishedSequences(ctx, s.sequenceFilter(events.StatusPublished, bounds))
	}()
	err := s.missingSequences(ctx, s.sequenceFilter(events.StatusNew, bounds), aggs, inBatch)
	<-pubRead
	if err := errors.Join(err, pubErr); err != nil {
		return nil, err
	}

	paused, err := s.pausedSet(ctx) // read by this claim already: cached
	if err != nil {
		return nil, err
	}
	pulled, pulledBytes := 0, 0
	var want []any
	for _, key := range keys {
		a := aggs[key]
		slices.SortStableFunc(a.missing, func(x, y seqEvent) int { return events.CompareInKey(x.doc, y.doc) })
		for _, m := range a.missing {
			if !claimableNow(m.doc, now, paused) || pulled >= limit.Events ||
				(limit.Bytes > 0 && pulledBytes >= limit.Bytes) {
				a.blockAt = m.seq
				break
			}
			pulled++
			pulledBytes += len(m.doc)
			want = append(want, m.id)
		}
	}
	if len(want) > 0 {
		if err := s.pullIn(ctx, now, paused, want, aggs); err != nil {
			return nil, err
		}
	}
	s.noteSequenceAnomalies(keys, aggs, published)
	out, dropped := arrangeBySequence(docs, aggs)
	if n := reordered(out, aggs); n > 0 {
		s.countSequence(events.SequenceReordered, n)
	}
	if len(want) > 0 {
		// What the read kept past the batch may hold what was taken in.
		// What was left behind needs no such care: a later version the
		// read-ahead gives waits behind it as it did.
		s.ahead.drop()
	}
	if dropped > 0 {
		s.countSequence(events.SequenceWaiting, dropped)
		s.logger.Debug("events left NEW behind an earlier version of their aggregate that cannot be claimed now", "events", dropped)
	}
	return out, nil
}

// sequencedAggregates gathers the batch's aggregates that have an event
// with a valid sequence, in the order the batch first names them, and
// the _ids of the batch.
func sequencedAggregates(docs []bson.Raw) (map[string]*seqAggregate, []string, map[string]bool) {
	aggs := map[string]*seqAggregate{}
	var keys []string
	plain := map[string]int{}
	inBatch := make(map[string]bool, len(docs))
	for _, doc := range docs {
		inBatch[idKey(doc)] = true
		key, keyed := events.OrderingKey(doc)
		if !keyed {
			continue
		}
		seq, ok := events.ValidSequence(doc)
		if !ok {
			plain[key]++
			continue
		}
		a := aggs[key]
		if a == nil {
			id, _ := doc.Lookup(events.FieldAggregateID).StringValueOK()
			a = &seqAggregate{id: id, blockAt: -1, minBatch: seq, maxBatch: seq}
			aggs[key] = a
			keys = append(keys, key)
		}
		a.batch = append(a.batch, seqEvent{id: rawID(doc.Lookup(events.FieldID)), seq: seq, doc: doc})
		a.minBatch, a.maxBatch = min(a.minBatch, seq), max(a.maxBatch, seq)
	}
	for key, n := range plain {
		if a := aggs[key]; a != nil {
			a.plain = n
		}
	}
	return aggs, keys, inBatch
}

// idKey is a map key for a document's _id: its type and bytes.
func idKey(doc bson.Raw) string {
	v := doc.Lookup(events.FieldID)
	return string(rune(v.Type)) + string(v.Value)
}

// sequenceProjection is what the sequence checks read of an event.
var sequenceProjection = bson.D{
	{Key: events.FieldAggregateType, Value: 1}, {Key: events.FieldAggregateID, Value: 1},
	{Key: events.FieldSequence, Value: 1}, {Key: events.FieldCreatedAt, Value: 1},
	{Key: events.FieldRetryAt, Value: 1}, {Key: events.FieldParked, Value: 1},
	{Key: events.FieldType, Value: 1},
}

// missingSequences reads the NEW events filter selects, and keeps in
// each aggregate those outside the batch below its own highest sequence
// in the batch. A NEW event is read whether due,
// backing off or parked: each of those must go before the batch's later
// versions.
func (s *Store) missingSequences(ctx context.Context, filter bson.D, aggs map[string]*seqAggregate, inBatch map[string]bool) error {
	cur, err := s.coll.Find(ctx, filter, options.Find().SetProjection(sequenceProjection).SetBatchSize(heldBatch))
	if err != nil {
		return fmt.Errorf("find earlier versions: %w", err)
	}
	defer closeCursor(ctx, cur)
	for cur.Next(ctx) {
		doc := cur.Current
		key, keyed := events.OrderingKey(doc)
		a := aggs[key]
		seq, ok := events.ValidSequence(doc)
		if !keyed || a == nil || !ok || seq >= a.maxBatch || inBatch[idKey(doc)] {
			continue
		}
		a.missing = append(a.missing, seqEvent{id: rawID(doc.Lookup(events.FieldID)), seq: seq, doc: slices.Clone(doc)})
	}
	if err := cur.Err(); err != nil {
		return fmt.Errorf("read earlier versions: %w", err)
	}
	return nil
}

// publishedSequences reads the sequences of the PUBLISHED events filter
// selects, by ordering key.
func (s *Store) publishedSequences(ctx context.Context, filter bson.D) (map[string][]int64, error) {
	cur, err := s.coll.Find(ctx, filter, options.Find().SetProjection(sequenceProjection).SetBatchSize(heldBatch))
	if err != nil {
		return nil, fmt.Errorf("find published versions: %w", err)
	}
	defer closeCursor(ctx, cur)
	out := map[string][]int64{}
	for cur.Next(ctx) {
		key, keyed := events.OrderingKey(cur.Current)
		if seq, ok := events.ValidSequence(cur.Current); keyed && ok {
			out[key] = append(out[key], seq)
		}
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("read published versions: %w", err)
	}
	return out, nil
}

// claimableNow reports whether a NEW event may be claimed at now by its
// own fields: not parked, not of a paused type, and not backing off.
func claimableNow(doc bson.Raw, now time.Time, paused map[string]bool) bool {
	if parked, _ := doc.Lookup(events.FieldParked).BooleanOK(); parked || paused[typeOf(doc)] {
		return false
	}
	retryAt, _ := doc.Lookup(events.FieldRetryAt).TimeOK()
	return !events.Held(events.StatusNew, retryAt, false, now, false)
}

// pullIn reads the whole documents of the earlier versions to take into
// the batch, still NEW, due and not parked; an aggregate one of which is
// no longer so waits for it instead.
func (s *Store) pullIn(ctx context.Context, now time.Time, paused map[string]bool, ids []any, aggs map[string]*seqAggregate) error {
	filter := bson.D{
		{Key: events.FieldStatus, Value: events.StatusNew},
		{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: ids}}},
	}
	cur, err := s.coll.Find(ctx, filter, options.Find().SetBatchSize(s.findBatch(len(ids))))
	if err != nil {
		return fmt.Errorf("find earlier versions to claim: %w", err)
	}
	defer closeCursor(ctx, cur)
	got := map[string]bson.Raw{}
	for cur.Next(ctx) {
		if claimableNow(cur.Current, now, paused) {
			got[idKey(cur.Current)] = slices.Clone(cur.Current)
		}
	}
	if err := cur.Err(); err != nil {
		return fmt.Errorf("read earlier versions to claim: %w", err)
	}
	for _, a := range aggs {
		for _, m := range a.missing {
			if a.blockAt >= 0 && m.seq >= a.blockAt {
				break
			}
			doc, ok := got[idKey(m.doc)]
			if !ok {
				a.blockAt = m.seq
				break
			}
			a.pulled = append(a.pulled, doc)
		}
	}
	return nil
}

// arrangeBySequence returns docs with each aggregate's earlier versions
// taken in placed before its first event, its sequenced events in
// sequence order, and, of an aggregate that must wait at blockAt, the
// events from its first above blockAt on left out; and how many were
// left out.
func arrangeBySequence(docs []bson.Raw, aggs map[string]*seqAggregate) ([]bson.Raw, int) {
	out := make([]bson.Raw, 0, len(docs))
	placed := map[string]bool{}
	for _, doc := range docs {
		if key, ok := events.OrderingKey(doc); ok && aggs[key] != nil && !placed[key] {
			placed[key] = true
			out = append(out, aggs[key].pulled...)
		}
		out = append(out, doc)
	}
	events.SortBySequence(out, func(d bson.Raw) bson.Raw { return d })
	kept := out[:0]
	stopped := map[string]bool{}
	dropped := 0
	for _, doc := range out {
		key, keyed := events.OrderingKey(doc)
		a := aggs[key]
		if keyed && a != nil && a.blockAt >= 0 {
			if seq, ok := events.ValidSequence(doc); ok && seq > a.blockAt {
				stopped[key] = true
			}
			if stopped[key] {
				dropped++
				continue
			}
		}
		kept = append(kept, doc)
	}
	return kept, dropped
}

// reordered counts the events of docs, as arranged, that go after an
// event of their aggregate with a later createdAt (events.CompareOrder):
// what the sequence changed of the order the clocks gave.
func reordered(docs []bson.Raw, aggs map[string]*seqAggregate) int {
	latest := map[string]bson.Raw{}
	n := 0
	for _, doc := range docs {
		key, keyed := events.OrderingKey(doc)
		if !keyed || aggs[key] == nil {
			continue
		}
		if l := latest[key]; l != nil && events.CompareOrder(doc, l) < 0 {
			n++
			continue
		}
		latest[key] = doc
	}
	return n
}
