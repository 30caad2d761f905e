package main

import (
	"fmt"
	"math"
	"time"
)

// The types of bench.json's figures. The figures themselves are declared
// by the stages that measure them.

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

// rateOf is n done in elapsed: seconds to the hundredth, the rate whole.
func rateOf(n int, elapsed time.Duration) Rate {
	return Rate{Count: n, Seconds: round(elapsed.Seconds(), 2), PerSecond: round(float64(n)/elapsed.Seconds(), 0)}
}

// describe reads "12,345 events/s (100,000 in 8.1 s)" for unit "events".
func (r Rate) describe(unit string) string {
	return fmt.Sprintf("%s %s/s (%s in %.1f s)", thousands(int(r.PerSecond)), unit, thousands(r.Count), r.Seconds)
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
	// size, through the same path, reading the oldest NEW events through
	// the {status, createdAt} index; RawUnsorted the same loop reading
	// any NEW events (nil in runs from before it was measured).
	Raw         Rate  `json:"rawLoop"`
	RawUnsorted *Rate `json:"rawLoopUnsorted,omitempty"`
	// RatioMin is the least ratio of the worker's rate to Raw's that the
	// target accepted; 0 in runs from before it was recorded
	// (slowRatioMin).
	RatioMin float64 `json:"ratioMin,omitempty"`
	// Workers are this build's worker, then the -baseline one if any.
	Workers []SlowWorker `json:"workers"`
	// BusyLoops is how many processes spun on the host's cores beside the
	// raw loops and the workers (a busy host); 0 on a quiet one.
	BusyLoops int `json:"busyLoops,omitempty"`
}

// SlowWorker is one worker process relaying a slow stage's backlog.
type SlowWorker struct {
	WorkerBuild
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
	// Ratio is PerSecond over the sorted raw loop's; RatioUnsorted over
	// the unsorted one's.
	Ratio         float64 `json:"ratioToRawLoop"`
	RatioUnsorted float64 `json:"ratioToUnsortedRawLoop,omitempty"`
	// Timeouts are the claims' and the sampler's, from the worker's log
	// and metrics (nil in runs from before they were read).
	Timeouts *Timeouts `json:"timeouts,omitempty"`
	WorkerCost
}

// WorkerBuild is a worker binary a stage runs, and which build it is.
type WorkerBuild struct {
	Build  string `json:"build"` // "this build" or "baseline"
	Binary string `json:"binary"`
}

// isCurrent reports whether the binary is this build's.
func (w WorkerBuild) isCurrent() bool { return w.Build == buildCurrent }

// currentOf returns the run of this build among runs, if it ran.
func currentOf[T interface{ isCurrent() bool }](runs []T) (T, bool) {
	for _, r := range runs {
		if r.isCurrent() {
			return r, true
		}
	}
	var none T
	return none, false
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

// round rounds x to digits decimals, so that the JSON stays readable.
func round(x float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(x*p) / p
}
