package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/outboxrelay/outbox/internal/otlpsink"
)

// The tracing stage: one worker drains a small backlog with tracing off
// (the default: a no-op tracer provider), then on, exporting over
// OTLP/HTTP to a receiver inside the harness that counts the spans, then
// on with the database commands traced too (OUTBOX_TRACE_MONGO). Each run
// reports the relay's rate and its CPU per 1,000 events. With -baseline,
// the baseline build drains the same backlog with tracing off as well, so
// that "off costs nothing" is a comparison within one run.
const (
	// tracingBacklog events per run: small, since FerretDB sets the pace
	// and four runs must fit the bench's budget (10 to 20 s each here).
	tracingBacklog = 2000
	tracingTimeout = 3 * time.Minute
)

// Modes of the tracing stage's runs.
const (
	tracingOff   = "off"
	tracingOn    = "on"
	tracingMongo = "on + database commands"
)

// Tracing is the tracing stage: the runs on one backlog size.
type Tracing struct {
	Backlog int          `json:"backlog"`
	Runs    []TracingRun `json:"runs"`
}

// TracingRun is one worker process draining the backlog in one mode.
type TracingRun struct {
	WorkerBuild
	Mode      string  `json:"mode"`
	Events    int     `json:"events"`
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"perSecond"`
	// Spans is what the receiver got from the worker, by the time it
	// had stopped (the worker exports what is queued at stop).
	Spans        int     `json:"spans"`
	SpansPer1000 float64 `json:"spansPer1000"`
	WorkerCost
}

var tracingFig = figure[Tracing]{"tracing"}

var tracingStage = stage{
	key: "tracing", figures: []anyFigure{tracingFig},
	steps: one("tracing off and on", (*bench).tracingRun), rows: tracingRows,
}

// tracingRun drains a fresh backlog once per mode (and with tracing off
// once per extra build).
func (b *bench) tracingRun(ctx context.Context) error {
	sink := &otlpsink.Sink{} // counts, keeps nothing
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: sink, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Close() }()
	endpoint := "http://" + ln.Addr().String()
	fmt.Fprintf(b.out, "   %s events per run, 1 worker; spans exported over OTLP/HTTP to a receiver in the harness (%s)\n",
		thousands(tracingBacklog), endpoint)

	t := Tracing{Backlog: tracingBacklog}
	type run struct {
		bin  WorkerBuild
		mode string
	}
	var runs []run
	for _, bin := range b.workerBinaries() {
		runs = append(runs, run{bin, tracingOff})
	}
	runs = append(runs, run{b.workerBinaries()[0], tracingOn}, run{b.workerBinaries()[0], tracingMongo})
	for _, r := range runs {
		env := []string{"OTEL_TRACES_EXPORTER=none"}
		switch r.mode {
		case tracingOn, tracingMongo:
			env = []string{
				"OTEL_TRACES_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_ENDPOINT=" + endpoint,
				"OTEL_SERVICE_NAME=outbox-bench", "OUTBOX_TRACE_MONGO=" + fmt.Sprint(r.mode == tracingMongo),
			}
		}
		before := sink.Count()
		tr, err := b.tracingDrain(ctx, r.bin, r.mode, env)
		if err != nil {
			return err
		}
		tr.Spans = sink.Count() - before
		if tr.Events > 0 {
			tr.SpansPer1000 = round(1000*float64(tr.Spans)/float64(tr.Events), 1)
		}
		t.Runs = append(t.Runs, tr)
		fmt.Fprintf(b.out, "   tracing %s (%s): %s\n", r.mode, r.bin.Build, tr.describe())
	}
	tracingFig.set(b.res, t)
	return nil
}

// tracingDrain is one worker of bin draining a fresh backlog with env.
func (b *bench) tracingDrain(ctx context.Context, bin WorkerBuild, mode string, env []string) (TracingRun, error) {
	label := strings.NewReplacer(" ", "-", "+", "", "--", "-").Replace(mode + "-" + bin.Build)
	coll, _, err := b.preparedCollection(ctx, "tracing_"+strings.ReplaceAll(label, "-", "_"))
	if err != nil {
		return TracingRun{}, err
	}
	defer dropQuietly(coll)
	if _, err := insertEvents(ctx, coll, tracingBacklog, 0, eventDoc); err != nil {
		return TracingRun{}, err
	}
	exchange := uniqueName("bench-tracing-" + label)
	cons, err := newConsumer(b.cfg.AMQPURL, exchange)
	if err != nil {
		return TracingRun{}, err
	}
	defer cons.close()

	start := time.Now()
	w, err := b.startWorker(workerOpts{
		id: "bench-tracing-" + label, collection: coll.Name(), exchange: exchange,
		schedule: b.cfg.DrainSched, bin: bin.Binary, env: env,
	})
	if err != nil {
		return TracingRun{}, err
	}
	defer w.Kill()
	out := TracingRun{WorkerBuild: bin, Mode: mode}
	if err := cons.waitFor(ctx, tracingBacklog, tracingTimeout); err != nil {
		if ctx.Err() != nil {
			return TracingRun{}, ctx.Err()
		}
		out.Error = err.Error()
	}
	arrivals, _ := cons.snapshot()
	out.Events = len(arrivals)
	elapsed := time.Since(start)
	if len(arrivals) > 0 {
		var last time.Time
		for _, at := range arrivals {
			last = maxTime(last, at)
		}
		elapsed = last.Sub(start)
	}
	if _, cmds, err := w.scrape(ctx); err == nil {
		out.DBCommands = cmds
	}
	st, stopErr := w.stop(stopTimeout)
	out.Seconds = round(elapsed.Seconds(), 2)
	out.PerSecond = round(float64(out.Events)/elapsed.Seconds(), 1)
	out.record(st, stopErr, out.Events)
	if out.Error != "" && out.Events == 0 {
		return out, errors.New(out.Error)
	}
	return out, nil
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// describe is the run's rate, CPU and spans.
func (r TracingRun) describe() string {
	s := fmt.Sprintf("%s events/s (%s in %.1f s), CPU %.1f ms per 1,000 events, %.1f database commands per 1,000, %.1f spans per 1,000",
		thousands(int(r.PerSecond)), thousands(r.Events), r.Seconds, r.CPUMsPer1000, r.DBCommandsPer1000, r.SpansPer1000)
	if r.Error != "" {
		s += "; " + r.Error
	}
	return s
}

// tracingRows adds a row per run, each traced one compared with this
// build's run with tracing off.
func tracingRows(r *Results, add addRow) {
	t, ok := tracingFig.get(r)
	if !ok {
		return
	}
	offAt := slices.IndexFunc(t.Runs, func(x TracingRun) bool { return x.isCurrent() && x.Mode == tracingOff })
	for i, run := range t.Runs {
		result := run.describe()
		if offAt >= 0 && i != offAt && t.Runs[offAt].CPUMsPer1000 > 0 && t.Runs[offAt].PerSecond > 0 {
			off := t.Runs[offAt]
			result += fmt.Sprintf("; %.2fx the CPU per 1,000 and %.2fx the rate of this build with tracing off",
				ratio(run.CPUMsPer1000, off.CPUMsPer1000), ratio(run.PerSecond, off.PerSecond))
		}
		add(fmt.Sprintf("Tracing %s: 1 worker drains %s events (%s)", run.Mode, thousands(t.Backlog), run.Build), result, "")
	}
}
