package events

import (
	"time"
	"unicode/utf8"
)

// AttemptErrorsKept is how many failed attempts an event's history
// (FieldAttemptErrors) keeps: the oldest goes when one more is added.
const AttemptErrorsKept = 10

// Bounds of one AttemptError as stored (AttemptError.Bounded), so that a
// history of AttemptErrorsKept fits the room ManagedReserveBytes keeps
// for it whatever the errors say.
const (
	attemptWorkerIDMaxBytes = 128
	attemptReasonMaxBytes   = 32
	attemptErrorMaxBytes    = 512
	// attemptOverheadBytes is an entry's BSON framing: the array index,
	// the four keys, their types and lengths, and the date.
	attemptOverheadBytes = 64
	attemptMaxBytes      = attemptWorkerIDMaxBytes + attemptReasonMaxBytes + attemptErrorMaxBytes + attemptOverheadBytes
)

// AttemptError is one failed attempt of an event: when, by which worker,
// the reason (the reason label of outbox_events_failed_total or
// outbox_events_released_total, or "stale" for a claim that recovery
// reset), and the error. Attempts that were refunded (a broker outage, a
// shutdown, an event held back behind its aggregate) were not the event's
// and are not recorded.
type AttemptError struct {
	At       time.Time `bson:"at" json:"at"`
	WorkerID string    `bson:"workerId" json:"workerId"`
	Reason   string    `bson:"reason" json:"reason"`
	Error    string    `bson:"error" json:"error"`
}

// Bounded is a, its fields cut to the bytes a stored entry may take.
func (a AttemptError) Bounded() AttemptError {
	a.WorkerID = Truncate(a.WorkerID, attemptWorkerIDMaxBytes)
	a.Reason = Truncate(a.Reason, attemptReasonMaxBytes)
	a.Error = Truncate(a.Error, attemptErrorMaxBytes)
	return a
}

// Truncate cuts s to at most n bytes on a rune boundary, ending it with
// "..." when it was cut.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const more = "..."
	cut := max(n-len(more), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + more
}
