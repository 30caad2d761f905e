// Package retention deletes PUBLISHED events once they are older than the
// retention period, in bounded batches so that it never holds the database
// for long. A run goes on while full batches come back, for at most
// MaxRunTime, and between two batches it leaves the database to the relay
// for as long as the last batch took: it keeps up with a relay that
// publishes fast, and takes at most about half of a busy database.
// FAILED events are never deleted: an operator decides.
package retention

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/outboxrelay/outbox/internal/rule"
	"github.com/outboxrelay/outbox/schedule"
	"github.com/outboxrelay/outbox/service"
)

// Store is the outbox as retention needs it.
type Store interface {
	// DeletePublished deletes up to limit events PUBLISHED before the given
	// time and returns how many.
	DeletePublished(ctx context.Context, before time.Time, limit int) (int, error)
}

const (
	// RetentionDefault is how long PUBLISHED events are kept.
	RetentionDefault = 7 * 24 * time.Hour
	// ScheduleDefault is how often retention runs.
	ScheduleDefault = "@every 1m"
	// BatchSizeDefault is how many events one delete removes.
	BatchSizeDefault = 1000
	// MaxRunTimeDefault bounds one run: under the default schedule's
	// minute, so that each run ends, and logs what it deleted, before the
	// next tick.
	MaxRunTimeDefault = 50 * time.Second
	// IdleMaxDefault is the longest gap between runs for an idle outbox
	// (Config.IdleSince): a find every 10 minutes instead of every minute.
	IdleMaxDefault = 10 * time.Minute
	// maxPause bounds the pause between two batches, so that one slow
	// delete does not stall the run.
	maxPause = 10 * time.Second
	// batchTimeout bounds one batch (a find and a delete), and is the
	// server-side time limit (maxTimeMS) of its commands. A batch of
	// BatchSizeDefault takes well under a second on a healthy database;
	// one that takes this long is better given up, on the server too,
	// than left to hold the database: the run ends, and the next tick
	// starts over.
	batchTimeout = 30 * time.Second
)

// Config configures a Cleaner.
type Config struct {
	// Retention is how long PUBLISHED events are kept. Zero keeps them
	// forever (the cleaner does nothing). Defaults to RetentionDefault
	// when the caller takes the worker's defaults.
	Retention time.Duration
	// Schedule is the cron schedule of runs. Defaults to ScheduleDefault.
	Schedule string
	// BatchSize is how many events one delete removes. Defaults to BatchSizeDefault.
	BatchSize int
	// MaxRunTime bounds one run: no batch starts after it. Defaults to
	// MaxRunTimeDefault.
	MaxRunTime time.Duration
	// Archetype is the logger, the metrics and the clock. The cutoff is
	// taken from Now: publishedAt is written against the database
	// server's clock, and a replica whose own clock is ahead would
	// otherwise delete events before their retention is up (or, behind,
	// keep them longer). Durations (the run's bound, the pauses) use the
	// local clock.
	service.Archetype
	// Yield, when set, says that claims are slow: scheduled runs are then
	// left out, more and more of them, but never deferred by more than
	// schedule.YieldMaxDefault (see schedule.Config.Yield), and a run in
	// progress ends after its current batch. Defaults to nil: never yields.
	Yield func() bool
	// IdleSince, when set, says since when the outbox's claims have found
	// nothing (claim.Claimer.IdleSince): scheduled runs then back off,
	// 1, 2, 4 ... ticks apart up to IdleMax (schedule.Config.IdleSince).
	// An idle outbox publishes nothing new, and what ages past the cutoff
	// meanwhile is deleted at most IdleMax later. Defaults to nil.
	IdleSince func() time.Time
	// IdleMax is the longest gap between runs while IdleSince is set.
	// Defaults to IdleMaxDefault.
	IdleMax time.Duration
}

func (c *Config) setDefaults() {
	c.Schedule = cmp.Or(c.Schedule, ScheduleDefault)
	c.BatchSize = cmp.Or(c.BatchSize, BatchSizeDefault)
	c.MaxRunTime = cmp.Or(c.MaxRunTime, MaxRunTimeDefault)
	c.IdleMax = cmp.Or(c.IdleMax, IdleMaxDefault)
	c.Archetype = c.Archetype.WithDefaults()
}

// Validate reports the first bad field, naming it and its value.
func (c Config) Validate() error {
	return rule.First("retention",
		rule.Check("Retention", c.Retention >= 0, c.Retention, "0 (keep forever) or more"),
		rule.AtLeast("BatchSize", c.BatchSize, 1),
		rule.Above("MaxRunTime", c.MaxRunTime, 0),
		schedule.Rule("Schedule", c.Schedule),
	)
}

// Cleaner deletes old PUBLISHED events on a schedule.
type Cleaner struct {
	cfg   Config
	store Store
	job   *schedule.Job
	now   func() time.Time
	// pause waits d between two batches; false when the cleaner is
	// stopping or ctx ends, which ends the run.
	pause func(ctx context.Context, d time.Duration) bool

	stopping chan struct{}
	stopOnce sync.Once

	// The run in progress, owned by the job's goroutine: when it started
	// (zero between runs), what it deleted, and the last batch's duration.
	runStart  time.Time
	runTotal  int
	lastTook  time.Duration
	runBefore time.Time // the last batch's cutoff, by Config.Now
}

// New returns a Cleaner; Start runs it.
func New(store Store, cfg Config) (*Cleaner, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Cleaner{cfg: cfg, store: store, now: time.Now, stopping: make(chan struct{})}
	c.pause = c.wait
	var err error
	if c.job, err = schedule.New(schedule.Config{
		Name: "retention", Schedule: cfg.Schedule, Run: c.runOnce, Logger: cfg.Logger,
		Yield: cfg.Yield, LeftOut: cfg.Metrics.RunsLeftOut.WithLabelValues("retention").Inc,
		IdleSince: cfg.IdleSince, IdleMax: cfg.IdleMax,
	}); err != nil {
		return nil, err
	}
	return c, nil
}

// Start starts the schedule and returns. With Retention zero it does nothing.
func (c *Cleaner) Start(ctx context.Context) error {
	if c.cfg.Retention == 0 {
		c.cfg.Logger.Info("retention off: PUBLISHED events are kept forever")
		return nil
	}
	return c.job.Start(ctx)
}

// Trigger asks for a run as soon as the current one, if any, is over, as
// a tick of the schedule does.
func (c *Cleaner) Trigger() { c.job.Trigger() }

// Stop ends the run in flight after its current batch. Idempotent; safe
// before Start.
func (c *Cleaner) Stop(ctx context.Context) error {
	c.stopOnce.Do(func() { close(c.stopping) })
	return c.job.Stop(ctx)
}

// wait sleeps d unless the cleaner stops or ctx ends first.
func (c *Cleaner) wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.stopping:
		return false
	case <-ctx.Done():
		return false
	}
}

// runOnce deletes one batch of a run. It reports more while full batches
// come back and the run is younger than MaxRunTime; the schedule then
// calls it again at once (checking for Stop in between), and it first
// pauses as long as the last batch took, leaving the database to the
// relay, and ends the run instead while claims are slow (Yield). A run
// that ends logs what it deleted.
func (c *Cleaner) runOnce(ctx context.Context) (more bool, err error) {
	if c.runStart.IsZero() {
		c.runStart, c.runTotal = c.now(), 0
	} else if (c.cfg.Yield != nil && c.cfg.Yield()) || !c.pause(ctx, min(c.lastTook, maxPause)) {
		c.endRun()
		return false, nil
	}
	start := c.now()
	before := c.cfg.Now().UTC().Add(-c.cfg.Retention)
	c.runBefore = before
	n, err := c.deleteBatch(ctx, before)
	c.lastTook = c.now().Sub(start)
	c.runTotal += n
	c.cfg.Metrics.Deleted.Add(float64(n))
	if err != nil {
		c.cfg.Metrics.JobErrors.WithLabelValues("retention").Inc()
		c.endRun()
		return false, fmt.Errorf("delete published events: %w", err)
	}
	if n < c.cfg.BatchSize || c.now().Sub(c.runStart) >= c.cfg.MaxRunTime {
		c.endRun()
		return false, nil
	}
	return true, nil
}

// deleteBatch deletes one batch under batchTimeout.
func (c *Cleaner) deleteBatch(ctx context.Context, before time.Time) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, batchTimeout)
	defer cancel()
	return c.store.DeletePublished(ctx, before, c.cfg.BatchSize)
}

// endRun logs what the run deleted and forgets it.
func (c *Cleaner) endRun() {
	if c.runTotal > 0 {
		c.cfg.Logger.Info("deleted published events", "count", c.runTotal,
			"published_before", c.runBefore, "took", c.now().Sub(c.runStart).String())
	}
	c.runStart, c.runTotal = time.Time{}, 0
}
