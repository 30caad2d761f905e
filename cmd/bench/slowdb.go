package main

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	driver "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/claim"
	"github.com/outboxrelay/outbox/internal/redact"
	"github.com/outboxrelay/outbox/internal/tcpproxy"
)

// slowStage is one measurement of the relay on a slow database ("slow down, never collapse"):
// one worker at its default settings (per-aggregate ordering, batch 500,
// claims @every 1s) relays a backlog from a database that is slowed, or
// holds a large backlog, and is set against the raw find/claim/mark loop
// run through the same path to the database in the same stage. Every
// event must arrive, at no less than slowRatioMin of the raw loop's rate.
type slowStage struct {
	key  string // its -only name
	name string
	// latency is added to every database round trip of both the worker
	// and the raw loop by a tcpproxy in front of the database; 0 is the
	// direct path.
	latency time.Duration
	backlog int
	env     []string // the worker's environment beyond its defaults
	// why says why the backlog is this size; printed with the stage.
	why string
	// ratioMin is the least worker rate, as a share of the sorted raw
	// loop's through the same path, that the target accepts.
	ratioMin float64
	// busy is how many busy loops spin beside the whole stage (busyLoops).
	busy int
	// skipped is a history of skipped FAILED events, older than the
	// backlog, beside it in every collection the stage relays
	// (skippedFailedDoc): kept until an operator acts, it grows in every
	// long-lived outbox, and a claim must not pay for it.
	skipped int
}

// slowRatioMin is the target's least ratio in runs that did not record
// their own (SlowRun.RatioMin).
const slowRatioMin = 0.7

// slowFig is the slow-database stages' runs, one per stage.
var slowFig = figure[[]SlowRun]{"slowDatabase"}

func targetSlowRatio(r SlowRun) string {
	return r.Name + ": worker vs raw loop through the same path"
}
func targetSlowDelivered(r SlowRun) string { return r.Name + ": every event delivered" }

// slowDBStage is the slow-database stage called key (slowStages). The
// latency stages run by default; the large backlogs take minutes each on
// FerretDB and are opt-in (make bench-slow).
func slowDBStage(key string, optIn bool) stage {
	return stage{
		key: key, optIn: optIn, figures: []anyFigure{slowFig},
		steps: func(b *bench) []step {
			s := b.cfg.slowStage(key)
			return []step{{s.name, func(ctx context.Context) error { return b.slowDB(ctx, s) }}}
		},
		rows:    func(r *Results, add addRow) { slowRows(r, key, add) },
		targets: func(r *Results, add addTarget) { slowTargets(r, key, add) },
	}
}

// slowStage returns the settings of the slow stage called key.
func (c config) slowStage(key string) slowStage {
	for _, s := range c.slowStages() {
		if s.key == key {
			return s
		}
	}
	panic("no slow stage " + key)
}

// slowStages are the slow-database stages' settings.
func (c config) slowStages() []slowStage {
	latencyWhy := fmt.Sprintf("%s events: %d claims of %d, enough for the worker to reach its pace while a stage, "+
		"the raw loop and each worker binary, stays near a minute at +600 ms (-db-latency-backlog)",
		thousands(c.LatencyBacklog), (c.LatencyBacklog+claim.BatchSizeDefault-1)/claim.BatchSizeDefault, claim.BatchSizeDefault)
	return []slowStage{
		{
			key: "db-latency-100ms", name: "slow database: +100 ms per round trip",
			latency: 100 * time.Millisecond, backlog: c.LatencyBacklog, why: latencyWhy, ratioMin: 0.8,
		},
		{
			key: "db-latency-600ms", name: "slow database: +600 ms per round trip, OUTBOX_STALE_AFTER=10s",
			latency: 600 * time.Millisecond, backlog: c.LatencyBacklog, env: []string{"OUTBOX_STALE_AFTER=10s"}, why: latencyWhy, ratioMin: 0.7,
		},
		{
			key: "backlog-20k", name: "backlog of 20,000 events",
			backlog: 20000, ratioMin: 0.9,
			why: "20,000 events at the worker's defaults; FerretDB reads every NEW event on each claim, so this takes minutes",
		},
		{
			key: "backlog-20k-busy", name: "backlog of 20,000 events beside two busy loops",
			backlog: 20000, ratioMin: 0.7, busy: 2,
			why: "20,000 events at the worker's defaults on a busy host: a loop spins on each of two cores beside the raw loops and the workers",
		},
		{
			key: "backlog-20k-skipped", name: "backlog of 20,000 events beside 30,000 skipped FAILED events",
			backlog: 20000, skipped: 30000, ratioMin: 0.72,
			why: "20,000 events at the worker's defaults beside a history of 30,000 skipped FAILED events, which an ordered claim reads " +
				"to learn which aggregates FAILED events hold; the target is 0.8 of backlog-20k's 0.9",
		},
		{
			key: "backlog-50k", name: "backlog of 50,000 events",
			backlog: 50000, ratioMin: 0.9,
			why: "50,000 events at the worker's defaults; on FerretDB the raw loop alone takes several minutes",
		},
	}
}

// slowDB runs one slow stage: the raw loop, then the worker under test,
// then the baseline worker if -baseline names one, each on a backlog of
// its own through the same path.
func (b *bench) slowDB(ctx context.Context, s slowStage) error {
	fmt.Fprintf(b.out, "   %s\n", s.why)
	uri, closePath, err := b.databasePath(s.latency)
	if err != nil {
		return err
	}
	defer closePath()
	client, err := driver.Connect(options.Client().ApplyURI(uri).SetMaxPoolSize(4).SetAppName("outbox-bench-slow"))
	if err != nil {
		return fmt.Errorf("connect to %s: %w", redact.URL(uri), err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = client.Disconnect(dctx)
	}()

	readings := &tableReadings{b: b}
	defer readings.drop()
	run := SlowRun{Key: s.key, Name: s.name, LatencyMs: s.latency.Milliseconds(), Backlog: s.backlog, WorkerEnv: s.env, RatioMin: s.ratioMin, BusyLoops: s.busy}
	if s.busy > 0 {
		stop, err := busyLoops(ctx, s.busy)
		if err != nil {
			return err
		}
		defer stop()
	}
	if run.Raw, err = b.slowRaw(ctx, client, s, true, readings); err != nil {
		return err
	}
	unsorted, err := b.slowRaw(ctx, client, s, false, readings)
	if err != nil {
		return err
	}
	run.RawUnsorted = &unsorted
	fmt.Fprintf(b.out, "   raw loops through the same path: sorted %s events in %.1fs: %.0f/s; unsorted %.1fs: %.0f/s\n",
		thousands(run.Raw.Count), run.Raw.Seconds, run.Raw.PerSecond, unsorted.Seconds, unsorted.PerSecond)

	// A worker at the 0.7x target needs 1.43 times the raw loop's time;
	// the deadline leaves room for that, its start-up and a busy host,
	// and stops a worker that has collapsed in a few minutes.
	timeout := time.Minute + time.Duration(2.5*run.Raw.Seconds*float64(time.Second))
	for _, bin := range b.workerBinaries() {
		w, err := b.slowWorker(ctx, s, uri, bin, timeout, readings)
		if err != nil {
			return err
		}
		w.Ratio = round(ratio(w.PerSecond, run.Raw.PerSecond), 3)
		w.RatioUnsorted = round(ratio(w.PerSecond, unsorted.PerSecond), 3)
		run.Workers = append(run.Workers, w)
		fmt.Fprintf(b.out, "   worker (%s): %s\n", w.Build, w.describe(s.backlog))
	}
	slowFig.set(b.res, append(slowFig.value(b.res), run))
	return readings.finish(ctx)
}

// workerBinaries are -worker and, with -baseline, the baseline binary.
func (b *bench) workerBinaries() []WorkerBuild {
	bins := []WorkerBuild{{buildCurrent, b.cfg.WorkerBin}}
	if b.cfg.Baseline != "" {
		bins = append(bins, WorkerBuild{buildBaseline, b.cfg.Baseline})
	}
	return bins
}

// Builds of the worker a slow stage reports.
const (
	buildCurrent  = "this build"
	buildBaseline = "baseline"
)

// databasePath returns the URI that reaches the database with latency
// added to every round trip, through a tcpproxy that the returned func
// closes; with no latency, the database's own URI.
func (b *bench) databasePath(latency time.Duration) (string, func(), error) {
	if latency <= 0 {
		return b.mongoURI, func() {}, nil
	}
	target, err := tcpproxy.Target(b.mongoURI)
	if err != nil {
		return "", nil, err
	}
	p, err := tcpproxy.New(target)
	if err != nil {
		return "", nil, err
	}
	p.SetLatency(latency)
	uri, err := tcpproxy.URI(b.mongoURI, p.Addr())
	if err != nil {
		p.Close()
		return "", nil, err
	}
	return uri, p.Close, nil
}

// slowRaw inserts the stage's backlog directly, then runs the sorted or
// the unsorted raw loop on it through client, at the worker's default
// batch size. readings takes the collection over.
func (b *bench) slowRaw(ctx context.Context, client *driver.Client, s slowStage, sorted bool, readings *tableReadings) (Rate, error) {
	name := "slow_raw_unsorted"
	if sorted {
		name = "slow_raw_sorted"
	}
	coll, _, err := b.preparedCollection(ctx, name)
	if err != nil {
		return Rate{}, err
	}
	read, err := rawReadOf(ctx, coll, sorted)
	if err != nil {
		dropQuietly(coll)
		return Rate{}, err
	}
	if err := insertBacklog(ctx, coll, s); err != nil {
		dropQuietly(coll)
		return Rate{}, err
	}
	tr := readings.start(ctx, coll, s.key, read.String(), s.backlog)
	through := client.Database(databaseName).Collection(coll.Name())
	relayed, batches, elapsed, err := rawLoop(ctx, through, claim.BatchSizeDefault, read)
	if err != nil {
		return Rate{}, fmt.Errorf("%s: %w", read, err)
	}
	if relayed != s.backlog {
		return Rate{}, fmt.Errorf("%s relayed %d events of %d", read, relayed, s.backlog)
	}
	tr.end(relayed, batches)
	return Rate{Count: relayed, Seconds: round(elapsed.Seconds(), 2), PerSecond: round(float64(relayed)/elapsed.Seconds(), 1)}, nil
}

// slowWorker runs one worker process of bin at its defaults (and the
// stage's env) on a fresh backlog through uri, until a consumer has every
// event or timeout passes. A worker that does not deliver everything in
// time is a result, reported in SlowWorker.Error, not a failure of the
// harness.
func (b *bench) slowWorker(ctx context.Context, s slowStage, uri string, bin WorkerBuild, timeout time.Duration, readings *tableReadings) (SlowWorker, error) {
	label := strings.ReplaceAll(bin.Build, " ", "-")
	name := "slow_" + strings.ReplaceAll(s.key, "-", "_") + "_" + strings.ReplaceAll(label, "-", "_")
	coll, _, err := b.preparedCollection(ctx, name)
	if err != nil {
		return SlowWorker{}, err
	}
	if err := insertBacklog(ctx, coll, s); err != nil {
		dropQuietly(coll)
		return SlowWorker{}, err
	}
	tr := readings.start(ctx, coll, s.key, "1 worker ("+bin.Build+")", s.backlog)
	exchange := uniqueName("bench-" + s.key + "-" + label)
	cons, err := newConsumer(b.cfg.AMQPURL, exchange)
	if err != nil {
		return SlowWorker{}, err
	}
	defer cons.close()

	start := time.Now()
	w, err := b.startWorker(workerOpts{
		id: "bench-" + s.key + "-" + label, collection: coll.Name(), exchange: exchange,
		env: s.env, bin: bin.Binary, mongoURI: uri, defaults: true,
	})
	if err != nil {
		return SlowWorker{}, err
	}
	defer w.Kill()

	out := SlowWorker{WorkerBuild: bin}
	if err := cons.waitFor(ctx, s.backlog, timeout); err != nil {
		if ctx.Err() != nil {
			return SlowWorker{}, ctx.Err()
		}
		out.Error = err.Error()
	}
	arrivals, _ := cons.snapshot()
	out.Events = len(arrivals)
	out.AllDelivered = out.Events == s.backlog
	elapsed := time.Since(start)
	if out.AllDelivered {
		last := slices.MaxFunc(slices.Collect(maps.Values(arrivals)), time.Time.Compare)
		elapsed = last.Sub(start)
	}
	if len(arrivals) > 0 {
		first := slices.MinFunc(slices.Collect(maps.Values(arrivals)), time.Time.Compare)
		out.FirstSeconds = round(first.Sub(start).Seconds(), 2)
	}

	claims := 0
	m, metricsErr := w.metricsAfter(ctx, float64(out.Events))
	if metricsErr == nil {
		out.DBCommands, claims = m.commands, m.readClaims()
	}
	st, stopErr := w.stop(stopTimeout)
	if t, err := loggedTimeouts(w.LogPath()); err == nil && metricsErr == nil {
		t.SamplerErrors, t.SamplerLeftOut = int(m.jobErrors["sampler"]), int(m.leftOut["sampler"])
		out.Timeouts = &t
	}
	tr.end(out.Events, claims)
	_, out.Deliveries = cons.snapshot()
	out.Seconds = round(elapsed.Seconds(), 2)
	out.PerSecond = round(float64(out.Events)/elapsed.Seconds(), 1)
	out.record(st, stopErr, out.Events)
	return out, nil
}

// slowRows adds the table rows of the slow stage called key: the raw
// loop, then each build's worker (the baseline's beside this build's),
// then whether this build delivered every event.
func slowRows(r *Results, key string, add addRow) {
	for _, run := range slowFig.value(r) {
		if run.Key != key {
			continue
		}
		path := "database direct"
		if run.LatencyMs > 0 {
			path = fmt.Sprintf("database +%d ms per round trip (proxy)", run.LatencyMs)
		}
		if run.BusyLoops > 0 {
			path += fmt.Sprintf(", %d busy loops beside", run.BusyLoops)
		}
		env := prefixed(", ", strings.Join(run.WorkerEnv, " "))
		add(fmt.Sprintf("Slow database, %s events, %s: raw loop (find %d, claim, mark) through the same path", thousands(run.Backlog), path, claim.BatchSizeDefault),
			run.Raw.describe("events"), "")
		if run.RawUnsorted != nil {
			add(fmt.Sprintf("Slow database, %s events, %s: unsorted raw loop (find %d in no order, claim, mark) through the same path", thousands(run.Backlog), path, claim.BatchSizeDefault),
				run.RawUnsorted.describe("events"), "")
		}
		for _, w := range run.Workers {
			result := w.describe(run.Backlog)
			target := ""
			if w.isCurrent() {
				target = targetSlowRatio(run)
			}
			if w.RatioUnsorted > 0 {
				result += fmt.Sprintf("; %.2fx the unsorted raw loop", w.RatioUnsorted)
			}
			add(fmt.Sprintf("Slow database, %s events, %s: 1 worker at its defaults%s (%s)", thousands(run.Backlog), path, env, w.Build), result, target)
			if w.Timeouts != nil {
				add(fmt.Sprintf("Slow database, %s events, %s: timeouts (%s)", thousands(run.Backlog), path, w.Build), w.Timeouts.describe(), "")
			}
		}
		if w, ok := currentOf(run.Workers); ok {
			add(fmt.Sprintf("Slow database, %s events, %s: every event delivered (this build)", thousands(run.Backlog), path),
				fmt.Sprintf("%s of %s", thousands(w.Events), thousands(run.Backlog)), targetSlowDelivered(run))
		}
	}
}

// slowTargets: this build's worker delivered every event of the stage
// called key, at slowRatioMin of the raw loop's rate at least.
func slowTargets(r *Results, key string, add addTarget) {
	for _, run := range slowFig.value(r) {
		w, ok := currentOf(run.Workers)
		if run.Key != key || !ok || run.Raw.PerSecond <= 0 {
			continue
		}
		add(targetSlowDelivered(run), fmt.Sprintf("all %s", thousands(run.Backlog)),
			fmt.Sprintf("%s of %s", thousands(w.Events), thousands(run.Backlog)), w.AllDelivered)
		least := cmp.Or(run.RatioMin, slowRatioMin)
		add(targetSlowRatio(run), fmt.Sprintf(">= %.1fx", least),
			fmt.Sprintf("%.2fx (%.0f of %.0f events/s)", w.Ratio, w.PerSecond, run.Raw.PerSecond), w.AllDelivered && w.Ratio >= least)
		if t := w.Timeouts; run.BusyLoops > 0 && t != nil {
			add(run.Name+": no claim times out twice at the same size", "0",
				fmt.Sprintf("%d of %d timeouts", t.Repeats, t.Claims), t.Repeats == 0)
			runs := sampleRuns(w.Seconds) - t.SamplerLeftOut
			add(run.Name+": the sampler's runs finish or give way", "fewer failed than taken",
				fmt.Sprintf("%d failed of about %d taken", t.SamplerErrors, runs), t.SamplerErrors < runs)
		}
	}
}

// sampleRuns is about how many samples a worker at its default schedule
// (ops.SampleScheduleDefault, every 15 s, and one at start) takes in
// seconds.
func sampleRuns(seconds float64) int { return int(seconds/15) + 1 }

// describe is the worker's figures in one line, for the table and the
// progress output.
func (w SlowWorker) describe(backlog int) string {
	if w.Events == 0 {
		return fmt.Sprintf("no event of %s in %.1f s; CPU %.2f s in all, peak RSS %.1f MB, %.0f database commands%s",
			thousands(backlog), w.Seconds, w.CPUSeconds, w.PeakRSSMB, sum(w.DBCommands), prefixed("; ", w.Error))
	}
	return fmt.Sprintf("%s events/s (%s of %s in %.1f s, first after %.1f s), %.2fx the raw loop; %s deliveries; "+
		"CPU %.1f ms per 1,000 events, peak RSS %.1f MB; %.1f database commands per 1,000 events%s",
		thousands(int(w.PerSecond)), thousands(w.Events), thousands(backlog), w.Seconds, w.FirstSeconds, w.Ratio,
		thousands(w.Deliveries), w.CPUMsPer1000, w.PeakRSSMB, w.DBCommandsPer1000, prefixed("; ", w.Error))
}

func sum(m map[string]float64) float64 {
	var t float64
	for _, v := range m {
		t += v
	}
	return t
}

// insertBacklog inserts a slow stage's skipped FAILED history, then its
// backlog.
func insertBacklog(ctx context.Context, coll *driver.Collection, s slowStage) error {
	if s.skipped > 0 {
		if _, err := insertEvents(ctx, coll, s.skipped, 0, skippedFailedDoc); err != nil {
			return err
		}
	}
	_, err := insertEvents(ctx, coll, s.backlog, 0, eventDoc)
	return err
}
