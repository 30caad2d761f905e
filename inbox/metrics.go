package inbox

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
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
	m := &Metrics{
		Processed: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "outbox", Subsystem: "inbox", Name: "processed_total",
			Help: "Messages whose handler succeeded and whose id was recorded.",
		}),
		Duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "outbox", Subsystem: "inbox", Name: "duplicates_total",
			Help: "Messages acknowledged without running the handler: their id was already recorded.",
		}),
		HandlerErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "outbox", Subsystem: "inbox", Name: "handler_errors_total",
			Help: "Handler runs that returned an error or panicked; each one rolled back.",
		}),
		Rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "outbox", Subsystem: "inbox", Name: "rejected_total",
			Help: "Messages rejected with requeue=false (dead-lettered where the queue has a dead-letter exchange), by reason.",
		}, []string{"reason"}),
		HandlerDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "outbox", Subsystem: "inbox", Name: "handler_duration_seconds",
			Help:    "Time from the start of a message's processing to its commit (insert, handler, commit), successful or not.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		Expired: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "outbox", Subsystem: "inbox", Name: "expired_total",
			Help: "Records deleted by the cleanup job after Retention (servers without TTL indexes only).",
		}),
	}
	for _, r := range []string{ReasonMaxAttempts, ReasonNoMessageID} {
		m.Rejected.WithLabelValues(r) // export zeros, so alerts see the series
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.Processed, m.Duplicates, m.HandlerErrors, m.Rejected, m.HandlerDuration, m.Expired} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("inbox: register metrics (one Inbox per Registerer): %w", err)
		}
	}
	return m, nil
}
