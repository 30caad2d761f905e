package metrics_test

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/outbox/events/inbox"
)

// A consumer that exports the inbox's counts to Prometheus, under the
// names docs/inbox.md lists. The inbox's module names no metrics library,
// so the consumer builds the collectors; this example is the one
// docs/inbox.md shows, compiled and run here.
func Example_inbox() {
	reg := prometheus.NewRegistry()
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "outbox", Subsystem: "inbox", Name: name, Help: help}
	}
	processed := prometheus.NewCounter(prometheus.CounterOpts(opts("processed_total", "Messages whose handler succeeded and whose id was recorded.")))
	duplicates := prometheus.NewCounter(prometheus.CounterOpts(opts("duplicates_total", "Messages acknowledged without running the handler.")))
	handlerErrors := prometheus.NewCounter(prometheus.CounterOpts(opts("handler_errors_total", "Handler runs that returned an error or panicked.")))
	rejected := prometheus.NewCounterVec(prometheus.CounterOpts(opts("rejected_total", "Messages rejected with requeue=false, by reason.")), []string{"reason"})
	duration := prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "outbox", Subsystem: "inbox", Name: "handler_duration_seconds",
		Help:    "Insert, handler and commit, per message.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	})
	expired := prometheus.NewCounter(prometheus.CounterOpts(opts("expired_total", "Records deleted by the cleanup job (no TTL).")))
	for _, r := range []string{inbox.ReasonMaxAttempts, inbox.ReasonNoMessageID} {
		rejected.WithLabelValues(r) // export zeros, so alerts see the series
	}
	reg.MustRegister(processed, duplicates, handlerErrors, rejected, duration, expired)

	m := inbox.Metrics{
		Processed:    processed.Inc,
		Duplicate:    duplicates.Inc,
		HandlerError: handlerErrors.Inc,
		Rejected:     func(reason string) { rejected.WithLabelValues(reason).Inc() },
		Handled:      func(d time.Duration) { duration.Observe(d.Seconds()) },
		Expired:      func(n int64) { expired.Add(float64(n)) },
	}
	// inbox.New(client, handle, inbox.Config{Database: "shop", Metrics: m})

	m.Processed()
	m.Rejected(inbox.ReasonMaxAttempts)
	families, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, f := range families {
		fmt.Println(f.GetName())
	}
	// Output:
	// outbox_inbox_duplicates_total
	// outbox_inbox_expired_total
	// outbox_inbox_handler_duration_seconds
	// outbox_inbox_handler_errors_total
	// outbox_inbox_processed_total
	// outbox_inbox_rejected_total
}
