// Package metrics defines the worker's Prometheus metrics in one place, so
// that docs/operations.md can list them from one file. Labels carry only
// small fixed sets of values: never event ids, types or credentials.
package metrics

import (
	"reflect"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/buildinfo"
	"github.com/outboxrelay/outbox/internal/promset"
)

const namespace = "outbox"

// Reasons an event is released back to NEW or fails.
const (
	ReasonInvalid           = "invalid"            // poison: cannot become a message
	ReasonRejected          = "rejected"           // poison: published alone, the broker closed the channel every time
	ReasonMaxAttempts       = "max_attempts"       // failed publishes used every attempt
	ReasonStaleMaxAttempts  = "stale_max_attempts" // stale claim on its last attempt
	ReasonTimeout           = "timeout"            // published alone, no confirm within the publish timeout, claim.TimeoutsAloneMax times
	ReasonNacked            = "nacked"
	ReasonReturned          = "returned"
	ReasonUnconfirmed       = "unconfirmed"
	ReasonBrokerUnavailable = "broker_unavailable"
	ReasonError             = "error"
	ReasonHeldBack          = "held_back" // not published: an earlier event of its aggregate in the batch was not
	// ReasonStale is recovery's reset of a stale claim to NEW, in an
	// event's attempt history; events_recovered_total counts it.
	ReasonStale = "stale"
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
	Unwritable      prometheus.Counter
	TraceDropped    prometheus.Counter
	PublishLatency  prometheus.Histogram
	ClaimBatchSize  prometheus.Histogram
	ClaimBatchLimit prometheus.Gauge
	ClaimTrimmed    prometheus.Counter
	ClaimFenced     prometheus.Counter
	Events          *prometheus.GaugeVec
	OldestNewAge    Sampled
	StaleProcessing Sampled
	HeldAggregates  Sampled
	OldestHeldAge   Sampled
	PausedTypes     Sampled
	BrokerConnected prometheus.Gauge
	PartitionsOwned prometheus.Gauge
	ClaimRuns       *prometheus.CounterVec
	JobErrors       *prometheus.CounterVec
	RunsLeftOut     *prometheus.CounterVec
	DBCommands      *prometheus.CounterVec
	// BuildInfo is 1, labelled with this binary's build (Prometheus'
	// *_build_info convention): a query joins it to tell the versions of
	// a rolling upgrade apart.
	BuildInfo *prometheus.GaugeVec

	// SequenceAnomalies counts what claims met of the events' sequences,
	// by kind (SequenceKinds).
	SequenceAnomalies *prometheus.CounterVec
}

// Unregister removes from reg the collectors NewOutbox registered with
// it, every field but the process's BuildInfo and DBCommands: an outbox
// the worker stops relaying leaves no series behind.
func (m *Metrics) Unregister(reg prometheus.Registerer) {
	v := reflect.ValueOf(m).Elem()
	for i := range v.NumField() {
		c, ok := v.Field(i).Interface().(prometheus.Collector)
		if ok && c != prometheus.Collector(m.BuildInfo) && c != prometheus.Collector(m.DBCommands) {
			reg.Unregister(c)
		}
	}
}

// Jobs are the background jobs whose failed runs JobErrors counts: the
// values of its label, each exported from the start at 0, so that a rate
// over them has a series before the first failure.
var Jobs = []string{"claim", "ownership", "recovery", "retention", "sampler"}

// Outcomes of a claim run, the values of ClaimRuns' label, each exported
// from the start at 0.
const (
	ClaimClaimed = "claimed" // read the outbox and claimed events
	ClaimIdle    = "idle"    // read the outbox and found nothing to claim
	ClaimUnowned = "unowned" // owned no partition (read nothing), or the database's fence refused the claim
	ClaimPaused  = "paused"  // the broker cannot take a publish: read nothing
	ClaimError   = "error"   // failed (counted in JobErrors too)
)

// ClaimOutcomes lists them.
var ClaimOutcomes = []string{ClaimClaimed, ClaimIdle, ClaimUnowned, ClaimPaused, ClaimError}

// FailedReasons are the values of Failed's reason label, each exported
// from the start at 0, so that a rate or an increase sees the first
// failure of a replica.
var FailedReasons = []string{ReasonInvalid, ReasonRejected, ReasonMaxAttempts, ReasonStaleMaxAttempts, ReasonTimeout}

// ReleasedReasons are the values of Released's reason label, each exported
// from the start at 0, so that the first release of a replica (a broker
// outage, a nack) is a rise that rate() sees.
var ReleasedReasons = []string{
	ReasonNacked, ReasonReturned, ReasonUnconfirmed, ReasonBrokerUnavailable, ReasonError, ReasonHeldBack,
}

// SequenceKinds are the values of SequenceAnomalies' kind label, each
// exported from the start at 0.
var SequenceKinds = []string{
	events.SequenceReordered, events.SequenceBehind, events.SequenceRepeat, events.SequenceMixed, events.SequenceWaiting,
}

// YieldingJobs are the periodic jobs that leave runs out while claims are
// slow: the values of RunsLeftOut's label, each exported from the start.
var YieldingJobs = []string{"recovery", "retention", "sampler"}

// New creates the collectors and registers them with reg. A nil reg leaves
// them unregistered, which is what tests and tools want.
func New(reg prometheus.Registerer) *Metrics {
	m, s := build()
	if err := s.Register(reg); err != nil {
		panic(err) // one Metrics per registry: a wiring bug
	}
	return m
}

// NewProcess creates the collectors of a worker that relays several
// outboxes and registers those of the process with reg: the build, and
// the database commands, which a client shared by the outboxes of one
// cluster counts for all of them (CommandMonitor). The rest stay
// unregistered: each outbox has its own (NewOutbox).
func NewProcess(reg prometheus.Registerer) *Metrics {
	m, _ := build()
	if reg != nil {
		reg.MustRegister(m.BuildInfo, m.DBCommands)
	}
	return m
}

// NewOutbox creates the collectors of one outbox of a worker, registers
// them with reg, which gives them the outbox's label
// (prometheus.WrapRegistererWith), and shares process's build and
// database commands instead of making its own.
func NewOutbox(reg prometheus.Registerer, process *Metrics) *Metrics {
	m, s := build()
	if err := s.RegisterExcept(reg, m.BuildInfo, m.DBCommands); err != nil {
		panic(err) // one outbox per label value: a wiring bug
	}
	m.BuildInfo, m.DBCommands = process.BuildInfo, process.DBCommands
	return m
}

// build creates the collectors and the Set that holds them.
func build() (*Metrics, *promset.Set) {
	s := promset.New(namespace, "")
	m := &Metrics{
		Claimed:    s.Counter("events_claimed_total", "Events claimed from NEW as PROCESSING by this worker."),
		Published:  s.Counter("events_published_total", "Events confirmed by the broker and marked PUBLISHED."),
		Failed:     s.CounterVec("events_failed_total", "Events moved to FAILED, by reason (invalid, rejected, max_attempts, stale_max_attempts, timeout).", "reason"),
		Released:   s.CounterVec("events_released_total", "Claimed events put back to NEW without publishing, by reason.", "reason"),
		Recovered:  s.Counter("events_recovered_total", "Stale PROCESSING events reset to NEW by the recovery job."),
		Deleted:    s.Counter("events_deleted_total", "PUBLISHED events deleted by retention."),
		LostClaims: s.Counter("claims_lost_total", "Events whose claim this worker lost (to recovery) before it could write their outcome."),
		Skipped: s.Counter("events_skipped_total",
			"NEW events this worker can neither claim nor mark FAILED (too close to the document size limit for any write) and leaves out of its claims until it restarts."),
		Unwritable: s.Counter("claim_refusals_unwritten_total",
			"Events a claim refused (invalid, or refused by the server) whose FAILED write failed too: each stays NEW, holds its aggregate, and the next claim tries again."),
		TraceDropped: s.Counter("trace_context_dropped_total",
			"Events whose stored trace context (traceparent, tracestate) was not valid: each was published without one."),
		SequenceAnomalies: s.CounterVec("sequence_anomalies_total",
			"Events (mixed: aggregates) a claim found out of sequence, by kind: reordered (put after an event of their aggregate with a later createdAt, by sequence), behind (lower than a version already published: published late), repeat (a version another event has: both published), mixed (an aggregate with events with and without a sequence), waiting (left NEW behind an earlier version that cannot be claimed now).", "kind"),
		PublishLatency: s.Histogram("publish_latency_seconds", "Time from an event's createdAt to its broker confirm.",
			[]float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900}),
		ClaimBatchSize: s.Histogram("claim_batch_size", "Events claimed per claim.",
			[]float64{1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500}),
		ClaimBatchLimit: s.Gauge("claim_batch_limit",
			"Events the next claim may take: the batch size, halved after each database timeout and grown back while claims succeed."),
		ClaimTrimmed: s.Counter("claim_trimmed_events_total",
			"Events read by a claim and left NEW because its write would not have fit in its partitions' validity."),
		ClaimFenced: s.Counter("claim_fenced_total",
			"Claims the database's fence refused (with transactions only): another worker held a partition of the claim under a later ownership tenure; nothing of the claim was written or published."),
		Events:          s.GaugeVec("events", "Events in the outbox by status, sampled on a schedule.", "status"),
		OldestNewAge:    sampled(s, "oldest_new_event_age_seconds", "Age of the oldest NEW event, sampled on a schedule; 0 when there is none."),
		StaleProcessing: sampled(s, "stale_processing_events", "PROCESSING events claimed longer ago than the stale threshold, sampled on a schedule."),
		HeldAggregates: sampled(s, "held_aggregates",
			"Aggregates whose later events wait behind an event backing off before a retry or FAILED and not skipped, sampled on a schedule."),
		OldestHeldAge: sampled(s, "oldest_held_event_age_seconds",
			"Age of the oldest event waiting behind a held aggregate, sampled on a schedule; 0 when there is none."),
		PausedTypes: sampled(s, "paused_types",
			"Event types an operator paused (worker pause, the console): the relay claims none of their events, which hold their aggregates; sampled on a schedule."),
		BrokerConnected: s.Gauge("broker_connected", "1 while this worker has a connection and channel to the broker."),
		PartitionsOwned: s.Gauge("partitions_owned",
			"Partitions this worker owns and may claim in, after its last ownership round: 0 on every replica means nothing relays."),
		ClaimRuns: s.CounterVec("claim_runs_total",
			"Claim runs by outcome: claimed, idle (nothing claimable), unowned (no partition owned, or the database's fence refused the claim), paused (broker not ready), error.", "result"),
		JobErrors: s.CounterVec("job_errors_total", "Runs of a background job (claim, ownership, recovery, retention, sampler) that failed.", "job"),
		RunsLeftOut: s.CounterVec("job_runs_left_out_total",
			"Scheduled runs of a periodic job (recovery, retention, sampler) left out because claims were slow.", "job"),
		DBCommands: s.CounterVec("db_commands_total",
			"Database commands this worker sent, by command name (find, update, delete, commitTransaction, ...).", "command"),
		BuildInfo: s.GaugeVec("build_info",
			"1, labelled with the worker's build: version (v0.1.0, or devel), VCS revision, build date, Go version and the platform it was built for.",
			"version", "revision", "build_date", "goversion", "goos", "goarch"),
	}
	build := buildinfo.Read()
	m.BuildInfo.WithLabelValues(build.Version, build.Revision, build.BuildDate, build.GoVersion, build.GOOS, build.GOARCH).Set(1)
	for _, job := range YieldingJobs {
		m.RunsLeftOut.WithLabelValues(job)
	}
	for _, job := range Jobs {
		m.JobErrors.WithLabelValues(job)
	}
	for _, r := range ClaimOutcomes {
		m.ClaimRuns.WithLabelValues(r)
	}
	for _, reason := range FailedReasons {
		m.Failed.WithLabelValues(reason)
	}
	for _, reason := range ReleasedReasons {
		m.Released.WithLabelValues(reason)
	}
	for _, command := range DBCommands() {
		m.DBCommands.WithLabelValues(command)
	}
	for _, kind := range SequenceKinds {
		m.SequenceAnomalies.WithLabelValues(kind)
	}
	return m, s
}

// OrNew returns m, or a new unregistered set when m is nil: the default of
// the Metrics field of the Configs that take one. The set is built only
// when it is needed, which cmp.Or could not do.
func OrNew(m *Metrics) *Metrics {
	if m == nil {
		return New(nil)
	}
	return m
}
