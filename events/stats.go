package events

import "time"

// Stats is a snapshot of the outbox for operators: what a store counts
// and the operations endpoints, the sampler and the status command show.
type Stats struct {
	// Counts holds the number of events in each of CountedStatuses: each
	// status, and under StatusUnknown the events whose status is none of
	// them. A store may estimate PUBLISHED (the MongoDB store does, from
	// the collection's size), because counting the retained history
	// exactly is costly; the others are exact.
	Counts map[Status]int64 `json:"counts"`
	// OldestNew is the createdAt of the oldest NEW event; zero when none.
	OldestNew time.Time `json:"oldestNew,omitzero"`
	// Stale counts PROCESSING events claimed before the stale threshold.
	Stale int64 `json:"staleProcessing"`
}

// OldestNewAge is how long the oldest NEW event has waited at now; now
// should be the database server's time.
//
// It is never negative. createdAt is written by the producer's clock, and
// even measured against the server's time an event can look younger than
// now: a producer whose clock runs ahead, or the offset's own uncertainty.
// An event cannot have waited less than no time, and a negative age would
// read on a dashboard or in an alert's arithmetic as a backlog that is
// ahead of schedule; so it is clamped at 0.
func (st Stats) OldestNewAge(now time.Time) time.Duration {
	return ageAt(st.OldestNew, now)
}

// HeldStats is what operators see of the aggregates held by ordering.
type HeldStats struct {
	// Aggregates counts the aggregates with NEW events waiting behind an
	// event that is backing off before a retry, or FAILED and not skipped
	// (where FAILED holds). An event in flight (PROCESSING) holds its
	// aggregate for a batch's time only and is not counted.
	Aggregates int64 `json:"heldAggregates"`
	// OldestWaiting is the createdAt of the oldest NEW event waiting
	// behind one of them; zero when none.
	OldestWaiting time.Time `json:"oldestHeld,omitzero"`
	// Capped says that a store read only part of the events it would need
	// for an exact count (the MongoDB store reads a bounded window of the
	// oldest), so that Aggregates is a lower bound.
	Capped bool `json:"heldCapped,omitempty"`
}

// OldestAge is how long the oldest held event has waited at now, clamped
// at 0 as Stats.OldestNewAge is.
func (h HeldStats) OldestAge(now time.Time) time.Duration {
	return ageAt(h.OldestWaiting, now)
}

// ageAt is how long since t at now: 0 when t is zero or after now.
func ageAt(t, now time.Time) time.Duration {
	if t.IsZero() {
		return 0
	}
	return max(now.Sub(t), 0)
}
