// Package ops is the worker's operations surface: the HTTP endpoints
// (/healthz, /readyz, /metrics, /status, /trigger) and the sampler that
// keeps the backlog gauges current on a schedule rather than on every
// scrape.
package ops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/schedule"
)

// StatsSource counts the outbox.
type StatsSource interface {
	Stats(ctx context.Context, staleBefore time.Time) (events.Stats, error)
}

// HeldSource reads the aggregates held by ordering.
type HeldSource interface {
	Held(ctx context.Context, now time.Time, failedHolds bool) (events.HeldStats, error)
}

const (
	// SampleScheduleDefault is how often the backlog gauges are refreshed.
	SampleScheduleDefault = "@every 15s"
	// sampleTimeout bounds one sample, so that a hung database leaves the
	// gauges at their last value rather than stalling the schedule.
	sampleTimeout = 10 * time.Second
)

// SamplerConfig configures a Sampler.
type SamplerConfig struct {
	// Store is counted at each sample. Required.
	Store StatsSource
	// StaleAfter is the stale threshold of the stale-processing gauge: the
	// recovery's OUTBOX_STALE_AFTER. Required.
	StaleAfter time.Duration
	// Schedule is the cron schedule of samples. Defaults to
	// SampleScheduleDefault.
	Schedule string
	// Held, when set, keeps the held-aggregates gauges current too, FAILED
	// events holding their aggregates when FailedHolds
	// (OUTBOX_ORDERING_AFTER_FAILED=wait).
	Held        HeldSource
	FailedHolds bool
	// Now is the clock ages and the stale threshold are measured with: the
	// database server's time (mongo.Clock.Now). Defaults to time.Now.
	Now func() time.Time
	// Metrics receives the gauges. Defaults to an unregistered set.
	Metrics *metrics.Metrics
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *SamplerConfig) setDefaults() {
	if c.Schedule == "" {
		c.Schedule = SampleScheduleDefault
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Metrics == nil {
		c.Metrics = metrics.New(nil)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate reports the first bad setting.
func (c SamplerConfig) Validate() error {
	if c.Store == nil {
		return errors.New("sampler store: required")
	}
	if c.StaleAfter <= 0 {
		return fmt.Errorf("stale after %s: want more than 0", c.StaleAfter)
	}
	if _, err := schedule.Parse(c.Schedule); err != nil {
		return fmt.Errorf("sample schedule: %w", err)
	}
	return nil
}

// Sampler refreshes the backlog gauges on a schedule.
type Sampler struct {
	cfg SamplerConfig
	job *schedule.Job
}

// NewSampler returns a Sampler; Start runs it.
func NewSampler(cfg SamplerConfig) (*Sampler, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("sampler config: %w", err)
	}
	s := &Sampler{cfg: cfg}
	var err error
	if s.job, err = schedule.New("sampler", cfg.Schedule, s.runOnce, cfg.Logger); err != nil {
		return nil, err
	}
	return s, nil
}

// Start samples once at once, then on the schedule.
func (s *Sampler) Start(ctx context.Context) error {
	if err := s.job.Start(ctx); err != nil {
		return err
	}
	s.job.Trigger()
	return nil
}

// Stop lets a sample in flight finish. Idempotent; safe before Start.
func (s *Sampler) Stop(ctx context.Context) error { return s.job.Stop(ctx) }

func (s *Sampler) runOnce(ctx context.Context) (bool, error) {
	now := s.cfg.Now().UTC()
	ctx, cancel := context.WithTimeout(ctx, sampleTimeout)
	defer cancel()
	m := s.cfg.Metrics
	st, err := s.cfg.Store.Stats(ctx, now.Add(-s.cfg.StaleAfter))
	if err != nil {
		m.JobErrors.WithLabelValues("sampler").Inc()
		return false, fmt.Errorf("sample outbox stats: %w", err)
	}
	for _, status := range events.Statuses {
		m.Events.WithLabelValues(string(status)).Set(float64(st.Counts[status]))
	}
	m.OldestNewAge.Set(st.OldestNewAge(now).Seconds())
	m.StaleProcessing.Set(float64(st.Stale))
	if s.cfg.Held != nil {
		h, err := s.cfg.Held.Held(ctx, now, s.cfg.FailedHolds)
		if err != nil {
			m.JobErrors.WithLabelValues("sampler").Inc()
			return false, fmt.Errorf("sample held aggregates: %w", err)
		}
		m.HeldAggregates.Set(float64(h.Aggregates))
		m.OldestHeldAge.Set(h.OldestAge(now).Seconds())
	}
	return false, nil
}
