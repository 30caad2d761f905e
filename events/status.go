package events

import "fmt"

// Status is where an event is in its lifecycle.
type Status string

const (
	// StatusNew is an event waiting to be claimed. Producers write it.
	StatusNew Status = "NEW"
	// StatusProcessing is an event claimed by one worker, being published.
	StatusProcessing Status = "PROCESSING"
	// StatusPublished is an event the broker has confirmed.
	StatusPublished Status = "PUBLISHED"
	// StatusFailed is an event that cannot be published without an
	// operator: it is malformed or ran out of attempts.
	StatusFailed Status = "FAILED"
)

// Statuses lists every status in lifecycle order.
var Statuses = []Status{StatusNew, StatusProcessing, StatusPublished, StatusFailed}

// StatusUnknown is not a status an event can be given: it is the label
// under which counts (Stats.Counts, the outbox_events gauge, worker stats)
// put events whose status is none of Statuses, such as a producer's "new",
// a number, or no status at all. The worker never claims such an event, so
// it waits, unpublished, until someone fixes it; lower case, so that it
// cannot be taken for a status.
const StatusUnknown Status = "unknown"

// CountedStatuses lists the labels events are counted under: Statuses, then
// StatusUnknown.
var CountedStatuses = append(Statuses[:len(Statuses):len(Statuses)], StatusUnknown)

// transitions holds every allowed status change. Anything else is a bug.
var transitions = map[Status][]Status{
	StatusNew:        {StatusProcessing},                         // claim
	StatusProcessing: {StatusPublished, StatusNew, StatusFailed}, // confirm, release or stale reset, give up
	StatusFailed:     {StatusNew},                                // operator requeue
	StatusPublished:  nil,                                        // final; only retention deletes it
}

// CanTransition reports whether an event may move from one status to another.
func CanTransition(from, to Status) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// ParseStatus returns the Status named by s, or an error naming s.
func ParseStatus(s string) (Status, error) {
	for _, st := range Statuses {
		if string(st) == s {
			return st, nil
		}
	}
	return "", fmt.Errorf("unknown status %q (want one of NEW, PROCESSING, PUBLISHED, FAILED)", s)
}
