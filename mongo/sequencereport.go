package mongo

import (
	"slices"

	"github.com/outboxrelay/outbox/events"
)

// noteSequenceAnomalies counts and logs the batch's events (and those it
// took in) whose sequence is behind or repeats one already published or
// another of the batch, and the aggregates that mix events with and
// without a sequence. A version taken in is seen as behind only against
// the published versions at or above the batch's lowest, which is all
// the published read returns.
func (s *Store) noteSequenceAnomalies(keys []string, aggs map[string]*seqAggregate, published map[string][]int64) {
	var behind, repeat []any
	mixed := 0
	for _, key := range keys {
		a := aggs[key]
		if a.plain > 0 {
			mixed++
		}
		pub := published[key]
		top := int64(-1)
		for _, p := range pub {
			top = max(top, p)
		}
		seen := map[int64]bool{}
		for _, doc := range a.pulled {
			if seq, _ := events.ValidSequence(doc); seq < top {
				behind = append(behind, rawID(doc.Lookup(events.FieldID)))
			}
		}
		for _, e := range a.batch {
			switch {
			case e.seq < top:
				behind = append(behind, e.id)
			case slices.Contains(pub, e.seq) || seen[e.seq]:
				repeat = append(repeat, e.id)
			}
			seen[e.seq] = true
		}
	}
	if len(behind) > 0 {
		s.countSequence(events.SequenceBehind, len(behind))
		s.logger.Warn("events whose sequence is lower than one already published of their aggregate: published late, out of order",
			"events", len(behind), "event_ids", firstIDs(behind))
	}
	if len(repeat) > 0 {
		s.countSequence(events.SequenceRepeat, len(repeat))
		s.logger.Warn("events whose sequence repeats another of their aggregate: published in createdAt order",
			"events", len(repeat), "event_ids", firstIDs(repeat))
	}
	if mixed > 0 {
		s.countSequence(events.SequenceMixed, mixed)
		s.logger.Debug("aggregates with events with and without a sequence: those without keep their createdAt place", "aggregates", mixed)
	}
}

// firstIDs is up to ten of ids, for a log line.
func firstIDs(ids []any) []any { return ids[:min(len(ids), 10)] }

// countSequence adds n to the count of kind (Config.SequenceAnomaly).
func (s *Store) countSequence(kind string, n int) {
	if s.sequenceAnomaly != nil {
		s.sequenceAnomaly(kind, n)
	}
}
