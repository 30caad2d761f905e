package main

import (
	"fmt"
	"math"
	"time"
)

// Results is everything one run measured; it is written as bench.json.
type Results struct {
	StartedAt    time.Time     `json:"startedAt"`
	TotalSeconds float64       `json:"totalSeconds"`
	Machine      Machine       `json:"machine"`
	Config       ConfigSummary `json:"config"`
	// Insert is how fast the harness wrote the raw loop's backlog.
	Insert    Rate `json:"backlogInsert"`
	RawBroker Rate `json:"rawBroker"`
	// RawBrokerCPUMsPer1000 is the harness's CPU per 1,000 raw publishes:
	// the host's floor for a confirmed publish, against which the worker's
	// CPU per event is compared.
	RawBrokerCPUMsPer1000 float64 `json:"rawBrokerCPUMsPer1000,omitempty"`
	RawDB                 Rate    `json:"rawDatabaseLoop"`
	PublishStage          Rate    `json:"publishStage"`
	Drains                []Drain `json:"drains"`
	// UnorderedDrains are the same drains with OUTBOX_ORDERING=none.
	UnorderedDrains []Drain `json:"unorderedDrains,omitempty"`
	// HotAggregate is one aggregate's backlog relayed in order, against
	// the same backlog relayed without ordering.
	HotAggregate *HotAggregate `json:"hotAggregate,omitempty"`
	Latency      []Latency     `json:"latency"`
	Claim        ClaimLatency  `json:"claimLatency"`
	// Retention is how fast the worker's retention deletes old history.
	Retention *RetentionRate `json:"retention,omitempty"`
	// ClaimBackoff is the claim's cost with events backing off at the
	// head of the collection, against none.
	ClaimBackoff *ClaimBackoff `json:"claimBackoff,omitempty"`
	// HeldAggregates is one worker relaying healthy events behind
	// aggregates held by FAILED events, against the same without them.
	HeldAggregates *HeldAggregates `json:"heldAggregates,omitempty"`
	// LargeDocs is one worker relaying documents near the 16 MiB limit.
	LargeDocs *LargeDocs `json:"largeDocuments,omitempty"`
	// SlowDB are the slow-database stages: one worker on a slowed database
	// or a large backlog against the raw loop through the same path.
	SlowDB []SlowRun `json:"slowDatabase,omitempty"`
	// Inbox is a consumer's rate with the inbox against a plain one.
	Inbox []InboxRun `json:"inbox,omitempty"`
	// SamplerStats times the worker's backlog sampler query (Stats) on
	// the 1-replica run's collection before and after its drain.
	SamplerStats []StatsCost `json:"samplerStats"`
	// Profile is the CPU profile of the 1-replica worker's drain.
	Profile        string      `json:"profile,omitempty"`
	ProfileSeconds float64     `json:"profileSeconds,omitempty"`
	Stages         []StageTime `json:"stages"`
	Targets        []Target    `json:"targets"`
}

// ConfigSummary is what the figures depend on.
type ConfigSummary struct {
	Backlog       int      `json:"backlog"`
	BatchSize     int      `json:"batchSize"`
	DrainSchedule string   `json:"drainSchedule"`
	LatencyRate   float64  `json:"latencyRate"`
	LatencySecs   float64  `json:"latencySeconds"`
	WorkerEnv     []string `json:"workerEnv,omitempty"`
}

func (c config) summary() ConfigSummary {
	return ConfigSummary{
		Backlog: c.Backlog, BatchSize: c.BatchSize, DrainSchedule: c.DrainSched,
		LatencyRate: c.LatencyRate, LatencySecs: c.LatencyFor.Seconds(), WorkerEnv: c.WorkerEnv,
	}
}

// Machine is where the run happened.
type Machine struct {
	CPUs       int    `json:"cpus"`
	CPUModel   string `json:"cpuModel"`
	MemoryMB   int    `json:"memoryMB"`
	Kernel     string `json:"kernel"`
	GoVersion  string `json:"goVersion"`
	RabbitMQ   string `json:"rabbitmq"`
	Database   string `json:"database"`
	PostgreSQL string `json:"postgresql,omitempty"`
}

// Rate is a count done in a time.
type Rate struct {
	Count     int     `json:"count"`
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"perSecond"`
}

// Drain is one run of the worker draining the backlog.
type Drain struct {
	Replicas int    `json:"replicas"`
	Schedule string `json:"schedule"`
	// Ordering is the workers' OUTBOX_ORDERING; empty in runs from
	// before ordering existed.
	Ordering   string  `json:"ordering,omitempty"`
	Events     int     `json:"events"`     // distinct events received
	Deliveries int     `json:"deliveries"` // messages received, duplicates included
	Duplicates int     `json:"duplicates"`
	Seconds    float64 `json:"seconds"`
	PerSecond  float64 `json:"perSecond"`
	// RatioToLimit is PerSecond over the lower of the two raw limits.
	RatioToLimit float64 `json:"ratioToLimit"`
	// Published sums the workers' outbox_events_published_total.
	Published float64 `json:"published"`
	// DBCommands sums the workers' outbox_db_commands_total by command.
	DBCommands        map[string]float64 `json:"dbCommands"`
	DBCommandsPer1000 float64            `json:"dbCommandsPer1000"`
	CPUSeconds        float64            `json:"cpuSeconds"`
	CPUMsPer1000      float64            `json:"cpuMsPer1000"`
	PeakRSSMB         float64            `json:"peakRssMB"` // the largest VmHWM of the replicas
	Workers           []WorkerStats      `json:"workers"`
}

// WorkerStats is one worker process, read from its /metrics before it
// stopped and its rusage after.
type WorkerStats struct {
	ID         string             `json:"id"`
	Published  float64            `json:"published"`
	DBCommands map[string]float64 `json:"dbCommands"`
	CPUSeconds float64            `json:"cpuSeconds"`
	PeakRSSMB  float64            `json:"peakRssMB"` // VmHWM
	// RusageMaxRSSMB is the rusage maxrss, which on Linux includes the
	// harness's own RSS at the moment it started the worker (vfork+exec).
	RusageMaxRSSMB float64 `json:"rusageMaxRssMB"`
	ExitCode       int     `json:"exitCode"`
}

// Latency is createdAt to receipt by a consumer, for events written at a
// steady rate.
type Latency struct {
	Schedule string `json:"schedule"`
	// WakeUp is how the worker's claims were woken, as its /status said:
	// "change stream", "polling" (the database refused change streams) or
	// "off" (OUTBOX_WAKE_ON_INSERT=false).
	WakeUp   string  `json:"wakeUp,omitempty"`
	Rate     float64 `json:"rate"`
	Seconds  float64 `json:"seconds"`
	Sent     int     `json:"sent"`
	Received int     `json:"received"`
	P50ms    float64 `json:"p50ms"`
	P90ms    float64 `json:"p90ms"`
	P99ms    float64 `json:"p99ms"`
	MaxMs    float64 `json:"maxMs"`
	// CPUMsPer1000 and PeakRSSMB are the worker's, over the whole run
	// (start-up and idle ticks included).
	CPUMsPer1000 float64 `json:"cpuMsPer1000"`
	PeakRSSMB    float64 `json:"peakRssMB"`
}

// ClaimLatency is one mongo.Store.Claim of a batch on a backlog of NEW
// events, without and with published history in the same collection.
type ClaimLatency struct {
	New              int       `json:"new"`
	BatchSize        int       `json:"batchSize"`
	EmptyMs          float64   `json:"medianMsWithoutHistory"`
	EmptyRunsMs      []float64 `json:"runsMsWithoutHistory"`
	PublishedWanted  int       `json:"publishedWanted"`
	Published        int       `json:"published"`
	InsertSeconds    float64   `json:"publishedInsertSeconds"`
	InsertPerSecond  float64   `json:"publishedInsertPerSecond"`
	WithHistoryMs    float64   `json:"medianMsWithHistory"`
	WithHistoryRunMs []float64 `json:"runsMsWithHistory"`
	Ratio            float64   `json:"ratio"`
}

// RetentionRate is retention.Cleaner over mongo.Store, at the worker's
// default settings, deleting a PUBLISHED history older than the retention
// period, watched for one period of its schedule or until none is left.
type RetentionRate struct {
	History   int     `json:"history"`
	Deleted   int     `json:"deleted"`
	Batches   int     `json:"deletes"`
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"perSecond"`
	Schedule  string  `json:"schedule"`
	BatchSize int     `json:"batchSize"`
}

// ClaimBackoff is mongo.Store.Claim of a batch on New claimable events,
// without and with BackingOff NEW events whose retryAt is an hour ahead
// and whose createdAt is older than every claimable one.
type ClaimBackoff struct {
	New        int       `json:"new"`
	BatchSize  int       `json:"batchSize"`
	BackingOff int       `json:"backingOff"`
	Without    ClaimCost `json:"without"`
	With       ClaimCost `json:"with"`
	Ratio      float64   `json:"ratio"`
}

// ClaimCost is what one claim cost, over a few runs.
type ClaimCost struct {
	MedianMs float64   `json:"medianMs"`
	RunsMs   []float64 `json:"runsMs"`
	// Commands is the database commands per claim.
	Commands float64 `json:"commandsPerClaim"`
	// DocsExamined is per claim, from serverStatus; -1 where the server
	// does not report it.
	DocsExamined float64 `json:"docsExaminedPerClaim"`
}

// InboxRun is one pass of a consumer over the same queued messages.
type InboxRun struct {
	Name         string  `json:"name"`
	PerSecond    float64 `json:"perSecond"`
	CommandsPer  float64 `json:"databaseCommandsPerMessage"`
	Commands     string  `json:"commands,omitempty"`
	Transactions bool    `json:"transactions"`
}

// SlowRun is one slow stage: the raw loop and one worker per build, each
// on a backlog of Backlog events, through the same path to the database.
type SlowRun struct {
	Key  string `json:"key"`
	Name string `json:"name"`
	// LatencyMs is added to every database round trip by a proxy; 0 is
	// the direct path.
	LatencyMs int64    `json:"latencyMs"`
	Backlog   int      `json:"backlog"`
	WorkerEnv []string `json:"workerEnv,omitempty"`
	// Raw is the raw find/claim/mark loop at the worker's default batch
	// size, through the same path.
	Raw Rate `json:"rawLoop"`
	// Workers are this build's worker, then the -baseline one if any.
	Workers []SlowWorker `json:"workers"`
}

// SlowWorker is one worker process relaying a slow stage's backlog.
type SlowWorker struct {
	Build  string `json:"build"` // "this build" or "baseline"
	Binary string `json:"binary"`
	// Events are the distinct events received; Deliveries counts
	// duplicates too.
	Events       int  `json:"events"`
	Deliveries   int  `json:"deliveries"`
	AllDelivered bool `json:"allDelivered"`
	// Seconds runs from the process's start to the last event's receipt,
	// or to the deadline when not all arrived; FirstSeconds to the first.
	Seconds      float64 `json:"seconds"`
	FirstSeconds float64 `json:"firstSeconds"`
	PerSecond    float64 `json:"perSecond"`
	// Ratio is PerSecond over the raw loop's.
	Ratio float64 `json:"ratioToRawLoop"`
	WorkerCost
}

// current returns the run's worker of this build, if it ran.
func (r SlowRun) current() (SlowWorker, bool) {
	for _, w := range r.Workers {
		if w.Build == buildCurrent {
			return w, true
		}
	}
	return SlowWorker{}, false
}

// LargeDocs is one worker relaying Events documents whose payload is one
// string of PayloadMiB, under a memory limit.
type LargeDocs struct {
	// Build is "this build" or "baseline"; empty in runs from before
	// -baseline ran this stage.
	Build  string `json:"build,omitempty"`
	Binary string `json:"binary,omitempty"`
	Events int    `json:"events"`
	// PayloadMiB is each event's payload string.
	PayloadMiB int `json:"payloadMiB"`
	Received   int `json:"received"`
	Deliveries int `json:"deliveries"`
	// WorkerEnv is the OUTBOX_BATCH_BYTES the worker ran with: the bound
	// it derived from the memory limit ("OUTBOX_BATCH_BYTES=<n>"), or
	// "OUTBOX_BATCH_BYTES=auto" when it did not log it. Runs from before
	// the memory limit set it in the environment.
	WorkerEnv string `json:"workerEnv"`
	// MemoryLimitEnv is the limit in the worker's environment
	// (GOMEMLIMIT); MemoryLimitMiB the same in MiB; MemoryLimitSource
	// where the worker says it read its limit. Empty in runs from before
	// the stage ran under a limit.
	MemoryLimitEnv    string `json:"memoryLimitEnv,omitempty"`
	MemoryLimitMiB    int    `json:"memoryLimitMiB,omitempty"`
	MemoryLimitSource string `json:"memoryLimitSource,omitempty"`
	// BatchBytes is the bound the worker derived (its "memory" log
	// line); 0 when it logged none.
	BatchBytes    int     `json:"batchBytes,omitempty"`
	InsertSeconds float64 `json:"insertSeconds"`
	Seconds       float64 `json:"seconds"`
	// PeakRSSMB is VmHWM in units of 2^20 bytes; PeakRSSToLimit is it
	// over MemoryLimitMiB.
	PeakRSSMB      float64 `json:"peakRssMB"`
	PeakRSSToLimit float64 `json:"peakRssToLimit,omitempty"`
	CPUSeconds     float64 `json:"cpuSeconds"`
	// Error says why not all arrived, if they did not.
	Error string `json:"error,omitempty"`
	// Baseline is the -baseline worker's run of the stage, if any.
	Baseline *LargeDocs `json:"baseline,omitempty"`
}

// StatsCost is how long one mongo.Store.Stats took.
type StatsCost struct {
	Backlog string  `json:"backlog"` // NEW or PUBLISHED
	Events  int     `json:"events"`
	Seconds float64 `json:"seconds"`
}

// StageTime is how long a stage of the run took.
type StageTime struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
}

// Target is one goal the benchmark checks and whether this run met it.
type Target struct {
	Name string `json:"name"`
	Want string `json:"want"`
	Got  string `json:"got"`
	Met  bool   `json:"met"`
}

// drain returns the run with n replicas, if there was one.
func (r *Results) drain(n int) (Drain, bool) {
	for _, d := range r.Drains {
		if d.Replicas == n {
			return d, true
		}
	}
	return Drain{}, false
}

// latencyAt returns the latency run at schedule, if there was one.
func (r *Results) latencyAt(schedule string) (Latency, bool) {
	for _, l := range r.Latency {
		if l.Schedule == schedule {
			return l, true
		}
	}
	return Latency{}, false
}

// Target names, as the report looks them up.
const (
	targetReplica1 = "1 replica vs raw database loop"
	targetCommands = "database commands per 1,000 events"
	targetPublish  = "publish stage vs raw broker"
	targetCPU      = "worker CPU per 1,000 events"
	targetRSS      = "worker peak RSS"
	targetP99      = "p99 latency at @every 100ms"
	targetClaim    = "claim latency with history vs none"
	targetRetain   = "retention delete rate vs 1-replica relay"
	targetHotOrder = "hot aggregate delivered in order"
	targetHeldNone = "held aggregates: no held event delivered"
	targetHeldAll  = "held aggregates: every healthy event delivered"
	targetLargeRSS = "large documents: worker peak RSS under its memory limit"
)

// Replicas must add capacity, not contention: a drain by n replicas at
// least 0.9 times as fast as by one, with at most twice its database
// commands per 1,000 events.
const (
	scaleRateMin     = 0.9
	scaleCommandsMax = 2.0
)

func targetSlowRatio(r SlowRun) string {
	return r.Name + ": worker vs raw loop through the same path"
}
func targetSlowDelivered(r SlowRun) string { return r.Name + ": every event delivered" }

func targetScaleRate(n int) string { return fmt.Sprintf("%d replicas vs 1: events/s", n) }
func targetScaleCommands(n int) string {
	return fmt.Sprintf("%d replicas vs 1: commands per 1,000 events", n)
}

// target returns the target called name, if it was evaluated.
func (r *Results) target(name string) (Target, bool) {
	for _, t := range r.Targets {
		if t.Name == name {
			return t, true
		}
	}
	return Target{}, false
}

// evaluate sets Targets from the figures.
func (r *Results) evaluate() {
	r.Targets = nil
	add := func(name, want, got string, met bool) {
		r.Targets = append(r.Targets, Target{Name: name, Want: want, Got: got, Met: met})
	}
	if d, ok := r.drain(1); ok && r.RawDB.PerSecond > 0 {
		ratio := d.PerSecond / r.RawDB.PerSecond
		add(targetReplica1, ">= 70%",
			fmt.Sprintf("%.0f%% (%.0f of %.0f events/s)", 100*ratio, d.PerSecond, r.RawDB.PerSecond), ratio >= 0.70)
		add(targetCommands, "<= 20",
			fmt.Sprintf("%.1f", d.DBCommandsPer1000), d.DBCommandsPer1000 <= 20)
		add(targetCPU, "<= 40 ms",
			fmt.Sprintf("%.1f ms", d.CPUMsPer1000), d.CPUMsPer1000 <= 40)
	}
	if r.RawBroker.PerSecond > 0 && r.PublishStage.PerSecond > 0 {
		ratio := r.PublishStage.PerSecond / r.RawBroker.PerSecond
		add(targetPublish, ">= 60%",
			fmt.Sprintf("%.0f%% (%.0f of %.0f/s)", 100*ratio, r.PublishStage.PerSecond, r.RawBroker.PerSecond), ratio >= 0.60)
	}
	if rss := r.peakRSS(); rss > 0 {
		add(targetRSS, "< 100 MB", fmt.Sprintf("%.1f MB", rss), rss < 100)
	}
	if l, ok := r.latencyAt("@every 100ms"); ok && l.Received > 0 {
		add(targetP99, "< 300 ms", fmt.Sprintf("%.0f ms", l.P99ms), l.P99ms < 300)
	}
	if d, ok := r.drain(1); ok && r.Retention != nil && d.PerSecond > 0 {
		ratio := r.Retention.PerSecond / d.PerSecond
		add(targetRetain, ">= 100%",
			fmt.Sprintf("%.0f%% (%.0f vs %.0f events/s)", 100*ratio, r.Retention.PerSecond, d.PerSecond), ratio >= 1)
	}
	if one, ok := r.drain(1); ok && one.PerSecond > 0 && one.DBCommandsPer1000 > 0 {
		for _, d := range r.Drains {
			if d.Replicas == 1 {
				continue
			}
			rate, cmds := d.PerSecond/one.PerSecond, d.DBCommandsPer1000/one.DBCommandsPer1000
			add(targetScaleRate(d.Replicas), fmt.Sprintf(">= %.1fx", scaleRateMin), fmt.Sprintf("%.2fx", rate), rate >= scaleRateMin)
			add(targetScaleCommands(d.Replicas), fmt.Sprintf("<= %.0fx", scaleCommandsMax), fmt.Sprintf("%.2fx", cmds), cmds <= scaleCommandsMax)
		}
	}
	for _, run := range r.SlowDB {
		w, ok := run.current()
		if !ok || run.Raw.PerSecond <= 0 {
			continue
		}
		add(targetSlowDelivered(run), fmt.Sprintf("all %s", thousands(run.Backlog)),
			fmt.Sprintf("%s of %s", thousands(w.Events), thousands(run.Backlog)), w.AllDelivered)
		add(targetSlowRatio(run), fmt.Sprintf(">= %.1fx", slowRatioMin),
			fmt.Sprintf("%.2fx (%.0f of %.0f events/s)", w.Ratio, w.PerSecond, run.Raw.PerSecond), w.AllDelivered && w.Ratio >= slowRatioMin)
	}
	if h := r.HotAggregate; h != nil {
		add(targetHotOrder, "0 inversions", fmt.Sprintf("%d inversions", h.Ordered.Inversions), h.Ordered.Inversions == 0)
	}
	if ld := r.LargeDocs; ld != nil && ld.MemoryLimitMiB > 0 {
		add(targetLargeRSS, fmt.Sprintf("< %d MiB, all %d received", ld.MemoryLimitMiB, ld.Events),
			fmt.Sprintf("%.1f MiB (%.0f%%), %d of %d received", ld.PeakRSSMB, 100*ld.PeakRSSToLimit, ld.Received, ld.Events),
			ld.PeakRSSMB < float64(ld.MemoryLimitMiB) && ld.Received == ld.Events)
	}
	if h := r.HeldAggregates; h != nil {
		if w, ok := h.current(); ok {
			add(targetHeldNone, "0 delivered, 0 changed",
				fmt.Sprintf("%d delivered, %d changed", w.HeldDelivered, w.HeldChanged), w.HeldDelivered == 0 && w.HeldChanged == 0)
			add(targetHeldAll, fmt.Sprintf("all %s", thousands(h.Healthy)),
				fmt.Sprintf("%s of %s", thousands(w.Healthy), thousands(h.Healthy)), w.AllHealthy)
		}
	}
	if c := r.Claim; c.EmptyMs > 0 && c.WithHistoryMs > 0 {
		add(targetClaim, "<= 2x",
			fmt.Sprintf("%.2fx (%.0f vs %.0f ms)", c.Ratio, c.WithHistoryMs, c.EmptyMs), c.Ratio <= 2)
	}
}

// peakRSS is the largest RSS of any worker process in the run.
func (r *Results) peakRSS() float64 {
	var m float64
	for _, d := range r.Drains {
		m = max(m, d.PeakRSSMB)
	}
	for _, l := range r.Latency {
		m = max(m, l.PeakRSSMB)
	}
	return m
}

// round rounds x to digits decimals, so that the JSON stays readable.
func round(x float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(x*p) / p
}
