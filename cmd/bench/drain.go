package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

const (
	// drainTimeout bounds one drain run.
	drainTimeout = 6 * time.Minute
	// stopTimeout bounds a worker's clean exit after SIGTERM.
	stopTimeout = 40 * time.Second
)

// Values of OUTBOX_ORDERING the drain runs use.
const (
	orderingAggregate = "aggregate" // the default: per-aggregate order
	orderingNone      = "none"
)

// The drains: with per-aggregate ordering (the default) in drainsFig,
// with OUTBOX_ORDERING=none in unorderedFig.
var (
	drainsFig    = figure[[]Drain]{"drains"}
	unorderedFig = figure[[]Drain]{"unorderedDrains"}
)

// Target names of the drains.
const targetReplica1 = "1 replica vs raw database loop"

func targetScaleRate(n int) string { return fmt.Sprintf("%d replicas vs 1: events/s", n) }

// Replicas must add capacity, not contention: a drain by n replicas at
// least 0.9 times as fast as by one, with at most twice its database
// commands per 1,000 events; by three replicas, 1.2 times as fast.
const (
	scaleRateMin     = 0.9
	scale3RateMin    = 1.2
	scaleCommandsMax = 2.0
)

// scaleRateMinOf is the least rate of a drain by n replicas, as a
// multiple of one's.
func scaleRateMinOf(n int) float64 {
	if n == 3 {
		return scale3RateMin
	}
	return scaleRateMin
}

// drainStage is the drains of the backlog by each -replicas count of
// worker processes, with ordering (OUTBOX_ORDERING) on or off. The ordered
// 1-replica drain also carries the side measurements (drainProbes).
func drainStage(ordering string) stage {
	s := stage{key: "drain", figures: []anyFigure{drainsFig}, rows: orderedDrainRows, targets: drainTargets}
	if ordering == orderingNone {
		s = stage{key: "drain-unordered", figures: []anyFigure{unorderedFig}, rows: unorderedDrainRows}
	}
	s.steps = func(b *bench) []step {
		var steps []step
		for _, n := range b.cfg.Replicas {
			name := fmt.Sprintf("worker x%d drain", n)
			if ordering != orderingAggregate {
				name += ", ordering off"
			}
			var probes []drainProbe
			if n == 1 && ordering == orderingAggregate {
				probes = b.drainProbes()
			}
			steps = append(steps, step{name, func(ctx context.Context) error { return b.drain(ctx, n, ordering, probes) }})
		}
		return steps
	}
	return s
}

// drainOf returns the drain by n replicas in drains, if there was one.
func drainOf(drains []Drain, n int) (Drain, bool) {
	for _, d := range drains {
		if d.Replicas == n {
			return d, true
		}
	}
	return Drain{}, false
}

// drain measures n worker processes relaying the backlog end to end: from
// the moment the processes start on a collection holding the whole backlog
// to the moment a consumer bound with "#" has received every event. With
// ordering "none" (OUTBOX_ORDERING=none) it records the run among the
// unordered drains. The probes take their side measurements before the
// workers start, while they run and after they stop.
func (b *bench) drain(ctx context.Context, n int, ordering string, probes []drainProbe) error {
	name, idPrefix := fmt.Sprintf("drain_x%d", n), fmt.Sprintf("bench-x%d", n)
	if ordering != orderingAggregate {
		name, idPrefix = name+"_"+ordering, idPrefix+"-"+ordering
	}
	coll, _, err := b.preparedCollection(ctx, name)
	if err != nil {
		return err
	}
	// The ordered drains count what PostgreSQL read under FerretDB, the
	// harness's probes left out.
	readings := &tableReadings{b: b}
	defer readings.drop()
	if _, err := insertEvents(ctx, coll, b.cfg.Backlog, 0, eventDoc); err != nil {
		dropQuietly(coll)
		return err
	}
	for _, p := range probes {
		if err := p.before(ctx, coll); err != nil {
			dropQuietly(coll)
			return err
		}
	}
	var tr *tableRun
	if ordering == orderingAggregate {
		tr = readings.start(ctx, coll, "drain", fmt.Sprintf("%d replica%s", n, plural(n)), b.cfg.Backlog)
	} else {
		defer dropQuietly(coll)
	}
	exchange := uniqueName("bench-" + strings.ReplaceAll(name, "_", "-"))
	cons, err := newConsumer(b.cfg.AMQPURL, exchange)
	if err != nil {
		return err
	}
	defer cons.close()

	start := time.Now()
	workers, err := b.startDrainWorkers(n, idPrefix, coll.Name(), exchange, ordering)
	defer func() {
		for _, w := range workers {
			w.Kill()
		}
	}()
	if err != nil {
		return err
	}
	during := make(chan error, len(probes))
	for _, p := range probes {
		go func() { during <- p.during(ctx, workers[0]) }()
	}

	if err := cons.waitFor(ctx, b.cfg.Backlog, drainTimeout); err != nil {
		return err
	}
	first, _ := cons.snapshot()
	last := slices.MaxFunc(slices.Collect(maps.Values(first)), time.Time.Compare)
	d := Drain{Replicas: n, Schedule: b.cfg.DrainSched, Ordering: ordering, Events: len(first), DBCommands: map[string]float64{}}
	claims, err := scrapeDrain(ctx, workers, &d)
	if err != nil {
		return err
	}
	for range probes {
		if err := <-during; err != nil {
			fmt.Fprintf(b.out, "   %v\n", err)
		}
	}
	err = stopDrain(workers, &d)
	workers = nil
	if err != nil {
		return err
	}
	_, d.Deliveries = cons.snapshot()
	if tr != nil {
		tr.end(d.Events, claims)
		if err := readings.finish(ctx); err != nil {
			return err
		}
	}
	for _, p := range probes {
		if err := p.after(ctx, coll); err != nil {
			return err
		}
	}
	d.finish(last.Sub(start), b.lowerLimit())
	fig := drainsFig
	if ordering != orderingAggregate {
		fig = unorderedFig
	}
	fig.set(b.res, append(fig.value(b.res), d))
	fmt.Fprintf(b.out, "   %d replica(s), OUTBOX_ORDERING=%s: %d events in %.1fs: %.0f/s (%.0f%% of the lower raw limit); %d duplicate deliveries\n",
		n, ordering, d.Events, d.Seconds, d.PerSecond, 100*d.RatioToLimit, d.Duplicates)
	fmt.Fprintf(b.out, "   %.1f database commands per 1,000 events %s; CPU %.1f ms per 1,000 events; peak RSS %.1f MB\n",
		d.DBCommandsPer1000, topCommands(d.DBCommands, 4), d.CPUMsPer1000, d.PeakRSSMB)
	return nil
}

// startDrainWorkers starts n worker processes on the drain's collection;
// on an error it returns those it started, for the caller to kill.
func (b *bench) startDrainWorkers(n int, idPrefix, collection, exchange, ordering string) ([]*workerProc, error) {
	workers := make([]*workerProc, 0, n)
	for i := range n {
		w, err := b.startWorker(workerOpts{
			id:         fmt.Sprintf("%s-%d", idPrefix, i+1),
			collection: collection,
			exchange:   exchange,
			schedule:   b.cfg.DrainSched,
			env:        []string{"OUTBOX_ORDERING=" + ordering},
		})
		if err != nil {
			return workers, err
		}
		workers = append(workers, w)
	}
	return workers, nil
}

// scrapeDrain reads each worker's published events and database commands
// from its /metrics into d, and returns their claims that read the
// outbox.
func scrapeDrain(ctx context.Context, workers []*workerProc, d *Drain) (claims int, err error) {
	ms, err := settledMetrics(ctx, workers, d.Events)
	if err != nil {
		return 0, err
	}
	for i, m := range ms {
		d.Workers = append(d.Workers, WorkerStats{ID: workers[i].id, Published: m.published, DBCommands: m.commands})
		d.Published += m.published
		for k, v := range m.commands {
			d.DBCommands[k] += v
		}
		claims += m.readClaims()
	}
	return claims, nil
}

// settledMetrics reads every worker's counters, again up to
// settleMetrics, until their published counts add up to events (see
// metricsAfter).
func settledMetrics(ctx context.Context, workers []*workerProc, events int) ([]workerMetrics, error) {
	deadline := time.Now().Add(settleMetrics)
	for {
		ms, err := scrapeAll(ctx, workers)
		published := 0.0
		for _, m := range ms {
			published += m.published
		}
		if err != nil || published >= float64(events) || time.Now().After(deadline) {
			return ms, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// scrapeAll reads every worker's counters.
func scrapeAll(ctx context.Context, workers []*workerProc) ([]workerMetrics, error) {
	ms := make([]workerMetrics, len(workers))
	for i, w := range workers {
		m, err := w.metrics(ctx)
		if err != nil {
			return nil, err
		}
		ms[i] = m
	}
	return ms, nil
}

// stopDrain stops every worker with SIGTERM and records its CPU and
// memory in d.
func stopDrain(workers []*workerProc, d *Drain) error {
	var errs []error
	for i, w := range workers {
		st, err := w.stop(stopTimeout)
		errs = append(errs, err)
		d.Workers[i].CPUSeconds = round(st.cpu.Seconds(), 3)
		d.Workers[i].PeakRSSMB = round(st.peakRSSMB, 1)
		d.Workers[i].RusageMaxRSSMB = round(st.rusageMaxRSSMB, 1)
		d.Workers[i].ExitCode = st.exitCode
		d.CPUSeconds += st.cpu.Seconds()
		d.PeakRSSMB = max(d.PeakRSSMB, round(st.peakRSSMB, 1))
	}
	return errors.Join(errs...)
}

// finish derives d's rates and per-1,000 figures from its counts, the
// time the drain took and the lower raw limit of the run (0: unknown).
func (d *Drain) finish(elapsed time.Duration, limit float64) {
	d.Duplicates = d.Deliveries - d.Events
	k := float64(d.Events) / 1000
	d.Seconds = round(elapsed.Seconds(), 2)
	d.PerSecond = round(float64(d.Events)/elapsed.Seconds(), 0)
	if limit > 0 {
		d.RatioToLimit = round(d.PerSecond/limit, 3)
	}
	d.DBCommandsPer1000 = round(sum(d.DBCommands)/k, 1)
	d.CPUSeconds = round(d.CPUSeconds, 3)
	d.CPUMsPer1000 = round(1000*d.CPUSeconds/k, 1)
}

// lowerLimit is the lower of the raw broker and raw database limits.
func (b *bench) lowerLimit() float64 {
	a, c := rawBrokerFig.value(b.res).PerSecond, rawDBFig.value(b.res).PerSecond
	switch {
	case a == 0:
		return c
	case c == 0:
		return a
	}
	return min(a, c)
}

func orderedDrainRows(r *Results, add addRow) {
	drains := drainsFig.value(r)
	for _, d := range drains {
		result := fmt.Sprintf("%s events/s (%s in %.1f s), %.0f%% of the lower raw limit",
			thousands(int(d.PerSecond)), thousands(d.Events), d.Seconds, 100*d.RatioToLimit)
		if d.Duplicates > 0 {
			result += fmt.Sprintf("; %s duplicate deliveries", thousands(d.Duplicates))
		}
		target := targetReplica1
		if unsorted := rawDBUnsortedFig.value(r).PerSecond; d.Replicas == 1 && unsorted > 0 {
			if sorted := rawDBFig.value(r).PerSecond; sorted > 0 {
				result += fmt.Sprintf("; %.2fx the sorted raw loop, %.2fx the unsorted", ratio(d.PerSecond, sorted), ratio(d.PerSecond, unsorted))
			}
		}
		if d.Replicas > 1 {
			target = targetScaleRate(d.Replicas)
			if one, ok := drainOf(drains, 1); ok && one.PerSecond > 0 {
				result += fmt.Sprintf("; %.2fx the 1-replica rate", ratio(d.PerSecond, one.PerSecond))
			}
		}
		add(fmt.Sprintf("Worker, %d replica%s, end to end (bin/worker, %s%s)", d.Replicas, plural(d.Replicas), d.Schedule, prefixed(", OUTBOX_ORDERING=", d.Ordering)), result, target)
	}
}

func unorderedDrainRows(r *Results, add addRow) {
	for _, d := range unorderedFig.value(r) {
		result := fmt.Sprintf("%s events/s (%s in %.1f s), %.0f%% of the lower raw limit; %s duplicate deliveries",
			thousands(int(d.PerSecond)), thousands(d.Events), d.Seconds, 100*d.RatioToLimit, thousands(d.Duplicates))
		if o, ok := drainOf(drainsFig.value(r), d.Replicas); ok && d.PerSecond > 0 {
			result += fmt.Sprintf("; ordered run %.0f%% of this", 100*ratio(o.PerSecond, d.PerSecond))
		}
		add(fmt.Sprintf("Worker, %d replica%s, end to end, ordering off (bin/worker, %s, OUTBOX_ORDERING=%s)", d.Replicas, plural(d.Replicas), d.Schedule, d.Ordering), result, "")
	}
}

// drainTargets: one replica at 70% of the raw database loop at least;
// more replicas at least scaleRateMin of one's rate.
func drainTargets(r *Results, add addTarget) {
	drains := drainsFig.value(r)
	one, ok := drainOf(drains, 1)
	if raw := rawDBFig.value(r).PerSecond; ok && raw > 0 {
		ratio := one.PerSecond / raw
		add(targetReplica1, ">= 70%",
			fmt.Sprintf("%.0f%% (%.0f of %.0f events/s)", 100*ratio, one.PerSecond, raw), ratio >= 0.70)
	}
	if !ok || one.PerSecond <= 0 {
		return
	}
	for _, d := range drains {
		if d.Replicas == 1 {
			continue
		}
		rate, least := d.PerSecond/one.PerSecond, scaleRateMinOf(d.Replicas)
		add(targetScaleRate(d.Replicas), fmt.Sprintf(">= %.1fx", least), fmt.Sprintf("%.2fx", rate), rate >= least)
	}
}

// topCommands lists the most frequent commands, most first.
func topCommands(cmds map[string]float64, n int) string {
	names := slices.Collect(maps.Keys(cmds))
	slices.SortFunc(names, func(a, b string) int {
		if cmds[a] != cmds[b] {
			if cmds[a] > cmds[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	s := "("
	for i, name := range names[:min(n, len(names))] {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s %.0f", name, cmds[name])
	}
	return s + ")"
}
