package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"

	driver "go.mongodb.org/mongo-driver/v2/mongo"
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

// drain measures n worker processes relaying the backlog end to end: from
// the moment the processes start on a collection holding the whole backlog
// to the moment a consumer bound with "#" has received every event. With
// ordering "none" (OUTBOX_ORDERING=none) it records the run among the
// unordered drains; the profile and the sampler timings belong to the
// default, ordered, 1-replica run.
func (b *bench) drain(ctx context.Context, n int, ordering string) error {
	name, idPrefix := fmt.Sprintf("drain_x%d", n), fmt.Sprintf("bench-x%d", n)
	main := ordering == orderingAggregate
	if !main {
		name, idPrefix = name+"_"+ordering, idPrefix+"-"+ordering
	}
	coll, _, err := b.preparedCollection(ctx, name)
	if err != nil {
		return err
	}
	defer dropQuietly(coll)
	if _, err := insertEvents(ctx, coll, b.cfg.Backlog, 0, eventDoc); err != nil {
		return err
	}
	if n == 1 && main {
		if err := b.timeStats(ctx, coll, "NEW"); err != nil {
			return err
		}
	}
	exchange := uniqueName("bench-" + strings.ReplaceAll(name, "_", "-"))
	cons, err := newConsumer(b.cfg.AMQPURL, exchange)
	if err != nil {
		return err
	}
	defer cons.close()

	start := time.Now()
	workers := make([]*workerProc, 0, n)
	defer func() {
		for _, w := range workers {
			w.Kill()
		}
	}()
	for i := range n {
		w, err := b.startWorker(workerOpts{
			id:         fmt.Sprintf("%s-%d", idPrefix, i+1),
			collection: coll.Name(),
			exchange:   exchange,
			schedule:   b.cfg.DrainSched,
			env:        []string{"OUTBOX_ORDERING=" + ordering},
		})
		if err != nil {
			return err
		}
		workers = append(workers, w)
	}

	// The single worker is CPU-profiled during its drain, in one profile
	// (each profile costs the worker some CPU to write).
	profiled := make(chan error, 1)
	if n == 1 && main && b.cfg.Profile {
		go func() { profiled <- b.profileDrain(ctx, workers[0]) }()
	} else {
		profiled <- nil
	}

	if err := cons.waitFor(ctx, b.cfg.Backlog, drainTimeout); err != nil {
		return err
	}
	first, _ := cons.snapshot()
	last := slices.MaxFunc(slices.Collect(maps.Values(first)), func(a, b time.Time) int { return a.Compare(b) })
	elapsed := last.Sub(start)

	d := Drain{Replicas: n, Schedule: b.cfg.DrainSched, Ordering: ordering, Events: len(first), DBCommands: map[string]float64{}}
	for _, w := range workers {
		pub, cmds, err := w.scrape(ctx)
		if err != nil {
			return err
		}
		d.Workers = append(d.Workers, WorkerStats{ID: w.id, Published: pub, DBCommands: cmds})
		d.Published += pub
		for k, v := range cmds {
			d.DBCommands[k] += v
		}
	}
	if err := <-profiled; err != nil {
		fmt.Fprintf(b.out, "   profile failed: %v\n", err)
		b.res.Profile = ""
	}
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
	workers = nil
	if err := errors.Join(errs...); err != nil {
		return err
	}
	_, d.Deliveries = cons.snapshot()
	if n == 1 && main {
		if err := b.timeStats(ctx, coll, "PUBLISHED"); err != nil {
			return err
		}
	}
	d.Duplicates = d.Deliveries - d.Events

	k := float64(d.Events) / 1000
	d.Seconds = round(elapsed.Seconds(), 2)
	d.PerSecond = round(float64(d.Events)/elapsed.Seconds(), 0)
	if limit := b.lowerLimit(); limit > 0 {
		d.RatioToLimit = round(d.PerSecond/limit, 3)
	}
	var total float64
	for _, v := range d.DBCommands {
		total += v
	}
	d.DBCommandsPer1000 = round(total/k, 1)
	d.CPUSeconds = round(d.CPUSeconds, 3)
	d.CPUMsPer1000 = round(1000*d.CPUSeconds/k, 1)
	if main {
		b.res.Drains = append(b.res.Drains, d)
	} else {
		b.res.UnorderedDrains = append(b.res.UnorderedDrains, d)
	}
	fmt.Fprintf(b.out, "   %d replica(s), OUTBOX_ORDERING=%s: %d events in %.1fs: %.0f/s (%.0f%% of the lower raw limit); %d duplicate deliveries\n",
		n, ordering, d.Events, d.Seconds, d.PerSecond, 100*d.RatioToLimit, d.Duplicates)
	fmt.Fprintf(b.out, "   %.1f database commands per 1,000 events %s; CPU %.1f ms per 1,000 events; peak RSS %.1f MB\n",
		d.DBCommandsPer1000, topCommands(d.DBCommands, 4), d.CPUMsPer1000, d.PeakRSSMB)
	return nil
}

// profileDrain saves one CPU profile of w covering most of its drain,
// whose length it guesses from the raw loop on the same backlog.
func (b *bench) profileDrain(ctx context.Context, w *workerProc) error {
	if err := w.waitReady(ctx, 30*time.Second); err != nil {
		return err
	}
	d := 10 * time.Second
	if raw := b.res.RawDB.Seconds; raw > 0 {
		d = time.Duration(0.7*raw) * time.Second
	}
	path := filepath.Join(b.rawDir, "worker-x1.cpu.prof")
	b.res.Profile = path
	b.res.ProfileSeconds = d.Seconds()
	return w.profile(ctx, d, path)
}

// timeStats times one mongo.Store.Stats, the query the worker's backlog
// sampler runs every 15 s on the leader, on the backlog as it stands.
func (b *bench) timeStats(ctx context.Context, coll *driver.Collection, state string) error {
	store := b.store(b.client, coll)
	t0 := time.Now()
	if _, err := store.Stats(ctx, t0.Add(-time.Minute)); err != nil {
		return fmt.Errorf("stats: %w", err)
	}
	d := time.Since(t0)
	b.res.SamplerStats = append(b.res.SamplerStats, StatsCost{Backlog: state, Events: b.cfg.Backlog, Seconds: round(d.Seconds(), 2)})
	fmt.Fprintf(b.out, "   the sampler's Stats() on %d %s events: %.2fs\n", b.cfg.Backlog, state, d.Seconds())
	return nil
}

// lowerLimit is the lower of the raw broker and raw database limits.
func (b *bench) lowerLimit() float64 {
	a, c := b.res.RawBroker.PerSecond, b.res.RawDB.PerSecond
	switch {
	case a == 0:
		return c
	case c == 0:
		return a
	}
	return min(a, c)
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
		if a < b {
			return -1
		}
		return 1
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
