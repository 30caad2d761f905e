package inbox

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/outbox/events/internal/promset"
)

// Reasons a message is rejected (label reason of outbox_inbox_rejected_total).
const (
	// ReasonMaxAttempts: the handler failed MaxAttempts times.
	ReasonMaxAttempts = "max_attempts"
	// ReasonNoMessageID: the message has no message_id to deduplicate on.
	ReasonNoMessageID = "no_message_id"
)

// Metrics are the inbox's collectors. Labels carry only the small fixed
// set of reasons above: never message ids, types or payloads.
type Metrics struct {
	Processed       prometheus.Counter
	Duplicates      prometheus.Counter
	HandlerErrors   prometheus.Counter
	Rejected        *prometheus.CounterVec
	HandlerDuration prometheus.Histogram
	Expired         prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*Metrics, error) {
	s := promset.New("outbox", "inbox")
	m := &Metrics{
		Processed:     s.Counter("processed_total", "Messages whose handler succeeded and whose id was recorded."),
		Duplicates:    s.Counter("duplicates_total", "Messages acknowledged without running the handler: their id was already recorded."),
		HandlerErrors: s.Counter("handler_errors_total", "Handler runs that returned an error or panicked; each one rolled back."),
		Rejected: s.CounterVec("rejected_total",
			"Messages rejected with requeue=false (dead-lettered where the queue has a dead-letter exchange), by reason.", "reason"),
		HandlerDuration: s.Histogram("handler_duration_seconds",
			"Time from the start of a message's processing to its commit (insert, handler, commit), successful or not.",
			prometheus.ExponentialBuckets(0.0005, 2, 16)),
		Expired: s.Counter("expired_total", "Records deleted by the cleanup job after Retention (servers without TTL indexes only)."),
	}
	for _, r := range []string{ReasonMaxAttempts, ReasonNoMessageID} {
		m.Rejected.WithLabelValues(r) // export zeros, so alerts see the series
	}
	if err := s.Register(reg); err != nil {
		return nil, fmt.Errorf("inbox: register metrics (one Inbox per Registerer): %w", err)
	}
	return m, nil
}
