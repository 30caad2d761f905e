package inbox

import "time"

// Reasons a message is rejected (Metrics.Rejected's reason; label reason
// of the relay's outbox_inbox_rejected_total).
const (
	// ReasonMaxAttempts: the handler failed MaxAttempts times.
	ReasonMaxAttempts = "max_attempts"
	// ReasonNoMessageID: the message has no message_id to deduplicate on.
	ReasonNoMessageID = "no_message_id"
)

// Metrics are what the inbox counts, as functions it calls as each thing
// happens; a nil one is not called. They are called from the goroutines
// of Run and Handle and from the cleanup job, so each must be safe for
// concurrent use. Their arguments carry only the small fixed set of
// reasons above and durations: never message ids, types or payloads.
//
// The inbox names no metrics library, so that a service's go.mod gets
// none from it. docs/inbox.md shows them counted by Prometheus collectors
// named outbox_inbox_*. A later minor version may add fields; it will not
// remove or change one.
type Metrics struct {
	// Processed is called when a handler succeeded and its message's id
	// was recorded.
	Processed func()
	// Duplicate is called when a message is acknowledged without running
	// the handler: its id was already recorded.
	Duplicate func()
	// HandlerError is called when a handler run returned an error or
	// panicked; each one rolled back.
	HandlerError func()
	// Rejected is called when a message is rejected with requeue=false
	// (dead-lettered where the queue has a dead-letter exchange), with
	// ReasonMaxAttempts or ReasonNoMessageID.
	Rejected func(reason string)
	// Handled is called with the time from the start of a message's
	// processing to its commit (insert, handler, commit), successful or
	// not.
	Handled func(d time.Duration)
	// Expired is called with the number of records the cleanup job
	// deleted after Retention (servers without TTL indexes only).
	Expired func(n int64)
}

// withDefaults is m with a no-op in place of each nil function, so that
// the inbox calls them without checking.
func (m Metrics) withDefaults() Metrics {
	if m.Processed == nil {
		m.Processed = func() {}
	}
	if m.Duplicate == nil {
		m.Duplicate = func() {}
	}
	if m.HandlerError == nil {
		m.HandlerError = func() {}
	}
	if m.Rejected == nil {
		m.Rejected = func(string) {}
	}
	if m.Handled == nil {
		m.Handled = func(time.Duration) {}
	}
	if m.Expired == nil {
		m.Expired = func(int64) {}
	}
	return m
}
