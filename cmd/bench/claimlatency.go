package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

// claimFig is the claim's latency without and with published history.
var claimFig = figure[ClaimLatency]{"claimLatency"}

const targetClaim = "claim latency with history vs none"

var claimStage = stage{
	key: "claim", figures: []anyFigure{claimFig},
	steps: one("claim latency", (*bench).claimLatency), rows: claimRows, targets: claimTargets,
}

// insertBudget is the time the claim stage may spend inserting published
// history: at most limit, and no more than what is left of the run's
// budget (left) once the second round of claims (twice the first's time,
// to be safe) and the report are provided for; never under 5 s.
func insertBudget(limit, left, claims time.Duration) time.Duration {
	return max(min(limit, left-2*claims-15*time.Second), 5*time.Second)
}

func claimRows(r *Results, add addRow) {
	cl := claimFig.value(r)
	if cl.New == 0 {
		return
	}
	add(fmt.Sprintf("Claim latency, store.Claim of %d on %s NEW, no history", cl.BatchSize, thousands(cl.New)),
		fmt.Sprintf("median %.0f ms of %d", cl.EmptyMs, len(cl.EmptyRunsMs)), "")
	add(fmt.Sprintf("Claim latency, same with %s PUBLISHED events (inserted in %.0f s)", thousands(cl.Published), cl.InsertSeconds),
		fmt.Sprintf("median %.0f ms of %d, %.2fx", cl.WithHistoryMs, len(cl.WithHistoryRunMs), cl.Ratio), targetClaim)
}

// claimTargets: the claim with history at most twice as slow as without.
func claimTargets(r *Results, add addTarget) {
	if c := claimFig.value(r); c.EmptyMs > 0 && c.WithHistoryMs > 0 {
		add(targetClaim, "<= 2x",
			fmt.Sprintf("%.2fx (%.0f vs %.0f ms)", c.Ratio, c.WithHistoryMs, c.EmptyMs), c.Ratio <= 2)
	}
}

// claimLatency times the worker's own mongo.Store.Claim of one batch on a
// backlog of NEW events, first alone, then with published history in the
// same collection: a claim that filters on status first never reads it.
func (b *bench) claimLatency(ctx context.Context) error {
	coll, store, err := b.preparedCollection(ctx, "claim_latency")
	if err != nil {
		return err
	}
	defer dropQuietly(coll)
	if _, err := insertEvents(ctx, coll, b.cfg.ClaimNew, 0, eventDoc); err != nil {
		return err
	}
	c := ClaimLatency{New: b.cfg.ClaimNew, BatchSize: b.cfg.BatchSize, PublishedWanted: b.cfg.Published}
	t0 := time.Now()
	if c.EmptyRunsMs, err = b.timeClaims(ctx, store); err != nil {
		return err
	}
	claims := time.Since(t0)
	c.EmptyMs = median(c.EmptyRunsMs)
	fmt.Fprintf(b.out, "   claim of %d on %d NEW, no history: median %.0f ms %v\n", b.cfg.BatchSize, c.New, c.EmptyMs, c.EmptyRunsMs)

	// The insert gets what is left of the run's budget once the second
	// round of claims (twice the first, to be safe) and the report are
	// provided for.
	budget := insertBudget(b.cfg.InsertBudget, time.Until(b.started.Add(b.cfg.Budget)), claims)
	t0 = time.Now()
	c.Published, err = insertEvents(ctx, coll, b.cfg.Published, budget, publishedDoc)
	if err != nil {
		return err
	}
	insert := time.Since(t0)
	c.InsertSeconds = round(insert.Seconds(), 1)
	c.InsertPerSecond = round(float64(c.Published)/insert.Seconds(), 0)
	fmt.Fprintf(b.out, "   inserted %d PUBLISHED events in %.1fs (%.0f/s, InsertMany of %d)", c.Published, c.InsertSeconds, c.InsertPerSecond, insertChunk)
	if c.Published < b.cfg.Published {
		fmt.Fprintf(b.out, "; the insert's time (%s) ran out before %d: using %d", budget.Round(time.Second), b.cfg.Published, c.Published)
	}
	fmt.Fprintln(b.out)

	if c.WithHistoryRunMs, err = b.timeClaims(ctx, store); err != nil {
		return err
	}
	c.WithHistoryMs = median(c.WithHistoryRunMs)
	c.Ratio = round(c.WithHistoryMs/c.EmptyMs, 2)
	fmt.Fprintf(b.out, "   claim of %d on %d NEW with %d PUBLISHED: median %.0f ms %v: %.2fx\n",
		b.cfg.BatchSize, c.New, c.Published, c.WithHistoryMs, c.WithHistoryRunMs, c.Ratio)
	claimFig.set(b.res, c)
	return nil
}

// timeClaims times ClaimRuns claims, putting each claimed batch back to
// NEW before the next, and returns the durations in milliseconds.
func (b *bench) timeClaims(ctx context.Context, store *mongo.Store) ([]float64, error) {
	var runs []float64
	for i := range b.cfg.ClaimRuns {
		lease := events.Lease{
			WorkerID: "bench-claim",
			Token:    fmt.Sprintf("run-%d-%d", time.Now().UnixNano(), i),
			At:       time.Now().UTC().Truncate(time.Millisecond),
		}
		t0 := time.Now()
		res, err := store.Claim(ctx, lease, events.ClaimLimit{Events: b.cfg.BatchSize})
		d := time.Since(t0)
		if err != nil {
			return nil, err
		}
		claimed := res.Claimed
		if len(claimed) != b.cfg.BatchSize {
			return nil, fmt.Errorf("claimed %d events, want %d", len(claimed), b.cfg.BatchSize)
		}
		runs = append(runs, round(float64(d)/float64(time.Millisecond), 1))
		if _, err := store.Abandon(ctx, lease); err != nil { // back to NEW for the next run
			return nil, err
		}
	}
	return runs, nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
