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
