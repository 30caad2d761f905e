package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	driver "go.mongodb.org/mongo-driver/v2/mongo"
)

// A drainProbe is a side measurement taken during a drain, beside the
// drain's own figures: before its workers start, on the first worker
// while they run, and after they have stopped. The ordered 1-replica
// drain carries them (drainProbes).
type drainProbe interface {
	before(ctx context.Context, coll *driver.Collection) error
	// during runs beside the drain; its error is printed, not fatal.
	during(ctx context.Context, w *workerProc) error
	after(ctx context.Context, coll *driver.Collection) error
}

// drainProbes are the side measurements of the ordered 1-replica drain:
// the sampler query's time, and with -profile a CPU profile of the worker.
func (b *bench) drainProbes() []drainProbe {
	probes := []drainProbe{samplerProbe{b}}
	if b.cfg.Profile {
		probes = append(probes, profileProbe{b})
	}
	return probes
}

// The side measurements' figures.
var (
	samplerFig        = figure[[]StatsCost]{"samplerStats"}
	profileFig        = figure[string]{"profile"}
	profileSecondsFig = figure[float64]{"profileSeconds"}
)

// samplerStage reports the sampler probe: what the worker's backlog
// sampler query costs on the drain's backlog, all NEW before the drain
// and all PUBLISHED after.
var samplerStage = stage{figures: []anyFigure{samplerFig}, rows: samplerRows}

// profileStage owns the profile probe's figures: the profile's path and
// length. It adds no row.
var profileStage = stage{figures: []anyFigure{profileFig, profileSecondsFig}}

// samplerProbe times one mongo.Store.Stats, the query the worker's backlog
// sampler runs every 15 s on the leader, on the drain's collection before
// and after the drain.
type samplerProbe struct{ b *bench }

func (p samplerProbe) before(ctx context.Context, coll *driver.Collection) error {
	return p.b.timeStats(ctx, coll, "NEW")
}

func (samplerProbe) during(context.Context, *workerProc) error { return nil }

func (p samplerProbe) after(ctx context.Context, coll *driver.Collection) error {
	return p.b.timeStats(ctx, coll, "PUBLISHED")
}

// timeStats times one mongo.Store.Stats on the backlog as it stands.
func (b *bench) timeStats(ctx context.Context, coll *driver.Collection, state string) error {
	store := b.store(b.client, coll)
	t0 := time.Now()
	if _, err := store.Stats(ctx, t0.Add(-time.Minute)); err != nil {
		return fmt.Errorf("stats: %w", err)
	}
	d := time.Since(t0)
	samplerFig.set(b.res, append(samplerFig.value(b.res), StatsCost{Backlog: state, Events: b.cfg.Backlog, Seconds: round(d.Seconds(), 2)}))
	fmt.Fprintf(b.out, "   the sampler's Stats() on %d %s events: %.2fs\n", b.cfg.Backlog, state, d.Seconds())
	return nil
}

func samplerRows(r *Results, add addRow) {
	stats := samplerFig.value(r)
	if len(stats) == 0 {
		return
	}
	var parts []string
	for _, st := range stats {
		parts = append(parts, fmt.Sprintf("%.2f s on %s %s", st.Seconds, thousands(st.Events), st.Backlog))
	}
	add("The worker's backlog sampler query (mongo.Store.Stats, every 15 s on the leader)", strings.Join(parts, ", "), "")
}

// profileProbe saves one CPU profile of the worker covering most of its
// drain (each profile costs the worker some CPU to write), whose length
// it guesses from the raw loop on the same backlog.
type profileProbe struct{ b *bench }

func (profileProbe) before(context.Context, *driver.Collection) error { return nil }
func (profileProbe) after(context.Context, *driver.Collection) error  { return nil }

func (p profileProbe) during(ctx context.Context, w *workerProc) error {
	b := p.b
	if err := w.waitReady(ctx, 30*time.Second); err != nil {
		return fmt.Errorf("profile failed: %w", err)
	}
	d := 10 * time.Second
	if raw := rawDBFig.value(b.res).Seconds; raw > 0 {
		d = time.Duration(0.7*raw) * time.Second
	}
	path := filepath.Join(b.rawDir, "worker-x1.cpu.prof")
	if err := w.profile(ctx, d, path); err != nil {
		return fmt.Errorf("profile failed: %w", err)
	}
	profileFig.set(b.res, path)
	profileSecondsFig.set(b.res, d.Seconds())
	return nil
}
