package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/retention"
	"github.com/outboxrelay/outbox/service"
)

// retentionWindow is how long the retention stage watches the cleaner: one
// period of its default schedule, so that a cleaner that deletes a bounded
// amount per run shows its sustained rate, not a burst.
const retentionWindow = time.Minute

// countingStore is the worker's store as retention sees it, noting how many
// events it deleted and when the last delete returned.
type countingStore struct {
	*mongo.Store
	mu      sync.Mutex
	deleted int
	last    time.Time
	batches int
}

func (s *countingStore) DeletePublished(ctx context.Context, before time.Time, limit int) (int, error) {
	n, err := s.Store.DeletePublished(ctx, before, limit)
	s.mu.Lock()
	s.deleted += n
	s.batches++
	s.last = time.Now()
	s.mu.Unlock()
	return n, err
}

func (s *countingStore) snapshot() (deleted, batches int, last time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deleted, s.batches, s.last
}

// retentionRate measures how fast the worker's retention (retention.Cleaner
// over mongo.Store, at its default settings) deletes a PUBLISHED history
// older than the retention period: started and triggered as a tick would,
// then watched for one schedule period or until the history is gone.
func (b *bench) retentionRate(ctx context.Context) error {
	coll, store, err := b.preparedCollection(ctx, "retention")
	if err != nil {
		return err
	}
	defer dropQuietly(coll)
	n := b.cfg.RetentionEvents
	// Published a day past the default retention period, one event a
	// millisecond, as a relay publishes them: in order.
	old := time.Now().Add(-retention.RetentionDefault - 24*time.Hour)
	if _, err := insertEvents(ctx, coll, n, 0, func(i int, _ time.Time) (bson.D, error) {
		return publishedDoc(i, old.Add(time.Duration(i)*time.Millisecond))
	}); err != nil {
		return err
	}
	cs := &countingStore{Store: store}
	cleaner, err := retention.New(cs, retention.Config{
		Retention: retention.RetentionDefault, Archetype: service.Archetype{Logger: b.logger, Metrics: metrics.New(nil)},
	})
	if err != nil {
		return err
	}
	start := time.Now()
	if err := cleaner.Start(ctx); err != nil {
		return err
	}
	cleaner.Trigger()
	deadline := start.Add(retentionWindow)
	deleted, batches, last := cs.snapshot()
	for deleted < n && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		deleted, batches, last = cs.snapshot()
	}
	// What the cleaner deletes after the window (a run that a tick at its
	// end started) does not count.
	elapsed := retentionWindow
	if deleted >= n {
		elapsed = last.Sub(start)
	}
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := cleaner.Stop(stopCtx); err != nil {
		return fmt.Errorf("stop the cleaner: %w", err)
	}
	r := RetentionRate{
		History: n, Deleted: deleted, Batches: batches,
		Seconds: round(elapsed.Seconds(), 2), PerSecond: round(float64(deleted)/elapsed.Seconds(), 0),
		Schedule: retention.ScheduleDefault, BatchSize: retention.BatchSizeDefault,
	}
	retentionFig.set(b.res, r)
	fmt.Fprintf(b.out, "   retention deleted %d of %d PUBLISHED events in %.1fs (%d deletes): %.0f/s\n",
		deleted, n, r.Seconds, batches, r.PerSecond)
	return nil
}

// retentionFig is the retention stage's delete rate.
var retentionFig = figure[RetentionRate]{"retention"}

const targetRetain = "retention delete rate vs 1-replica relay"

var retentionStage = stage{
	key: "retention", figures: []anyFigure{retentionFig},
	steps: one("retention delete rate", (*bench).retentionRate), rows: retentionRows, targets: retentionTargets,
}

func retentionRows(r *Results, add addRow) {
	rt, ok := retentionFig.get(r)
	if !ok {
		return
	}
	result := fmt.Sprintf("%s events/s (%s of %s in %.1f s, %d deletes)",
		thousands(int(rt.PerSecond)), thousands(rt.Deleted), thousands(rt.History), rt.Seconds, rt.Batches)
	if d, ok := drainOf(drainsFig.value(r), 1); ok {
		result += fmt.Sprintf(", %.0f%% of the 1-replica relay's %s events/s", 100*ratio(rt.PerSecond, d.PerSecond), thousands(int(d.PerSecond)))
	}
	add(fmt.Sprintf("Retention delete rate (retention.Cleaner at its defaults: %s, batches of %s; history older than the retention period)",
		rt.Schedule, thousands(rt.BatchSize)), result, targetRetain)
}

// retentionTargets: retention deletes at least as fast as one replica
// relays.
func retentionTargets(r *Results, add addTarget) {
	rt, ok := retentionFig.get(r)
	d, one := drainOf(drainsFig.value(r), 1)
	if !ok || !one || d.PerSecond <= 0 {
		return
	}
	ratio := rt.PerSecond / d.PerSecond
	add(targetRetain, ">= 100%",
		fmt.Sprintf("%.0f%% (%.0f vs %.0f events/s)", 100*ratio, rt.PerSecond, d.PerSecond), ratio >= 1)
}
