// Package metrics defines the worker's Prometheus metrics in one place, so
// that docs/operations.md can list them from one file. Labels carry only
// small fixed sets of values: never event ids, types or credentials.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

const namespace = "outbox"

// Reasons an event is released back to NEW or fails.
const (
	ReasonInvalid           = "invalid"            // poison: cannot become a message
	ReasonRejected          = "rejected"           // poison: published alone, the broker closed the channel every time
	ReasonMaxAttempts       = "max_attempts"       // failed publishes used every attempt
	ReasonStaleMaxAttempts  = "stale_max_attempts" // stale claim on its last attempt
	ReasonNacked            = "nacked"
	ReasonReturned          = "returned"
	ReasonUnconfirmed       = "unconfirmed"
	ReasonBrokerUnavailable = "broker_unavailable"
	ReasonError             = "error"
	ReasonHeldBack          = "held_back" // not published: an earlier event of its aggregate in the batch was not
)

// Metrics holds every collector the worker updates.
type Metrics struct {
	Claimed         prometheus.Counter
	Published       prometheus.Counter
	Failed          *prometheus.CounterVec
	Released        *prometheus.CounterVec
	Recovered       prometheus.Counter
	Deleted         prometheus.Counter
	LostClaims      prometheus.Counter
	Skipped         prometheus.Counter
	PublishLatency  prometheus.Histogram
	ClaimBatchSize  prometheus.Histogram
	Events          *prometheus.GaugeVec
	OldestNewAge    prometheus.Gauge
	StaleProcessing prometheus.Gauge
	HeldAggregates  prometheus.Gauge
	OldestHeldAge   prometheus.Gauge
	BrokerConnected prometheus.Gauge
	JobErrors       *prometheus.CounterVec
	DBCommands      *prometheus.CounterVec
}

// New creates the collectors and registers them with reg. A nil reg leaves
// them unregistered, which is what tests and tools want.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Claimed: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "events_claimed_total",
			Help: "Events claimed from NEW as PROCESSING by this worker.",
		}),
		Published: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "events_published_total",
			Help: "Events confirmed by the broker and marked PUBLISHED.",
		}),
		Failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "events_failed_total",
			Help: "Events moved to FAILED, by reason (invalid, rejected, max_attempts, stale_max_attempts).",
		}, []string{"reason"}),
		Released: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "events_released_total",
			Help: "Claimed events put back to NEW without publishing, by reason.",
		}, []string{"reason"}),
		Recovered: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "events_recovered_total",
			Help: "Stale PROCESSING events reset to NEW by the recovery job.",
		}),
		Deleted: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "events_deleted_total",
			Help: "PUBLISHED events deleted by retention.",
		}),
		LostClaims: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "claims_lost_total",
			Help: "Events whose claim this worker lost (to recovery) before it could write their outcome.",
		}),
		Skipped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "events_skipped_total",
			Help: "NEW events this worker can neither claim nor mark FAILED (too close to the document size limit for any write) and leaves out of its claims until it restarts.",
		}),
		PublishLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "publish_latency_seconds",
			Help:    "Time from an event's createdAt to its broker confirm.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900},
		}),
		ClaimBatchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "claim_batch_size",
			Help:    "Events claimed per claim.",
			Buckets: []float64{1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500},
		}),
		Events: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "events",
			Help: "Events in the outbox by status, sampled on a schedule.",
		}, []string{"status"}),
		OldestNewAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "oldest_new_event_age_seconds",
			Help: "Age of the oldest NEW event, sampled on a schedule; 0 when there is none.",
		}),
		StaleProcessing: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "stale_processing_events",
			Help: "PROCESSING events claimed longer ago than the stale threshold, sampled on a schedule.",
		}),
		HeldAggregates: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "held_aggregates",
			Help: "Aggregates whose later events wait behind an event backing off before a retry or FAILED and not skipped, sampled on a schedule.",
		}),
		OldestHeldAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "oldest_held_event_age_seconds",
			Help: "Age of the oldest event waiting behind a held aggregate, sampled on a schedule; 0 when there is none.",
		}),
		BrokerConnected: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "broker_connected",
			Help: "1 while this worker has a connection and channel to the broker.",
		}),
		JobErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "job_errors_total",
			Help: "Runs of a background job (claim, recovery, retention, sampler) that failed.",
		}, []string{"job"}),
		DBCommands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "db_commands_total",
			Help: "Database commands this worker sent, by command name (find, update, delete, commitTransaction, ...).",
		}, []string{"command"}),
	}
	if reg != nil {
		reg.MustRegister(m.Claimed, m.Published, m.Failed, m.Released, m.Recovered, m.Deleted,
			m.LostClaims, m.Skipped, m.PublishLatency, m.ClaimBatchSize, m.Events, m.OldestNewAge,
			m.StaleProcessing, m.HeldAggregates, m.OldestHeldAge, m.BrokerConnected, m.JobErrors, m.DBCommands)
	}
	return m
}
