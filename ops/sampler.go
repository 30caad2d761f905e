// Package ops is the worker's operations surface: the HTTP endpoints
// (/healthz, /readyz, /metrics, /status, /trigger) and the sampler that
// keeps the backlog gauges current on a schedule rather than on every
// scrape.
package ops

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/rule"
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
	// Active, when set, says whether this replica samples: the gauges
	// describe the whole outbox, so one replica (the ownership leader)
	// samples for all of them, and the others export none of them rather
	// than repeat the same queries. Defaults to nil: always samples.
	Active func() bool
	// Now is the clock ages and the stale threshold are measured with: the
	// database server's time (mongo.Clock.Now). Defaults to time.Now.
	Now func() time.Time
	// Metrics receives the gauges. Defaults to an unregistered set.
	Metrics *metrics.Metrics
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *SamplerConfig) setDefaults() {
	c.Schedule = cmp.Or(c.Schedule, SampleScheduleDefault)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	c.Metrics = metrics.OrNew(c.Metrics)
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate reports the first bad field, naming it and its value.
func (c SamplerConfig) Validate() error {
	return rule.First("ops sampler",
		rule.Required("Store", c.Store != nil),
		rule.Above("StaleAfter", c.StaleAfter, 0),
		schedule.Rule("Schedule", c.Schedule),
	)
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
		return nil, err
	}
	s := &Sampler{cfg: cfg}
	var err error
	if s.job, err = schedule.New(schedule.Config{Name: "sampler", Schedule: cfg.Schedule, Run: s.runOnce, RunAtStart: true, Logger: cfg.Logger}); err != nil {
		return nil, err
	}
	return s, nil
}

// Start samples once at once, then on the schedule.
func (s *Sampler) Start(ctx context.Context) error { return s.job.Start(ctx) }

// Stop lets a sample in flight finish. Idempotent; safe before Start.
func (s *Sampler) Stop(ctx context.Context) error { return s.job.Stop(ctx) }

// Trigger samples as soon as the sample in flight, if any, is over: for a
// replica that has just become the one that samples.
func (s *Sampler) Trigger() { s.job.Trigger() }

func (s *Sampler) runOnce(ctx context.Context) (bool, error) {
	if s.cfg.Active != nil && !s.cfg.Active() {
		s.clear()
		return false, nil
	}
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

// clear withdraws the gauges of a replica that does not sample.
func (s *Sampler) clear() {
	m := s.cfg.Metrics
	m.Events.Reset()
	for _, g := range []metrics.Sampled{m.OldestNewAge, m.StaleProcessing, m.HeldAggregates, m.OldestHeldAge} {
		g.Clear()
	}
}
