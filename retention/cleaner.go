// Package retention deletes PUBLISHED events once they are older than the
// retention period, in bounded batches so that it never holds the database
// for long. FAILED events are never deleted: an operator decides.
package retention

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/schedule"
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
	// maxBatchesPerRun bounds one run; the next run goes on.
	maxBatchesPerRun = 10
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
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Metrics defaults to an unregistered set.
	Metrics *metrics.Metrics
}

// Cleaner deletes old PUBLISHED events on a schedule.
type Cleaner struct {
	cfg   Config
	store Store
	job   *schedule.Job
	now   func() time.Time
}

// New returns a Cleaner; Start runs it.
func New(store Store, cfg Config) (*Cleaner, error) {
	if cfg.Schedule == "" {
		cfg.Schedule = ScheduleDefault
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = BatchSizeDefault
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New(nil)
	}
	if cfg.Retention < 0 {
		return nil, fmt.Errorf("retention %s: want 0 (keep forever) or more", cfg.Retention)
	}
	if cfg.BatchSize < 1 {
		return nil, fmt.Errorf("retention batch size %d: want at least 1", cfg.BatchSize)
	}
	c := &Cleaner{cfg: cfg, store: store, now: time.Now}
	var err error
	if c.job, err = schedule.New("retention", cfg.Schedule, c.runOnce, cfg.Logger); err != nil {
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

// Stop lets a run in flight finish. Idempotent; safe before Start.
func (c *Cleaner) Stop(ctx context.Context) error { return c.job.Stop(ctx) }

// runOnce deletes up to maxBatchesPerRun batches. A larger history is
// worked off run by run, leaving the database to the relay in between.
func (c *Cleaner) runOnce(ctx context.Context) (bool, error) {
	before := c.now().UTC().Add(-c.cfg.Retention)
	total := 0
	defer func() {
		c.cfg.Metrics.Deleted.Add(float64(total))
		if total > 0 {
			c.cfg.Logger.Info("deleted published events", "count", total, "published_before", before)
		}
	}()
	for range maxBatchesPerRun {
		n, err := c.store.DeletePublished(ctx, before, c.cfg.BatchSize)
		total += n
		if err != nil {
			c.cfg.Metrics.JobErrors.WithLabelValues("retention").Inc()
			return false, fmt.Errorf("delete published events: %w", err)
		}
		if n < c.cfg.BatchSize {
			return false, nil
		}
	}
	return false, nil
}
