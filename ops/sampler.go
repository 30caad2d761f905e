// Package ops is the worker's operations surface: the HTTP endpoints
// (/healthz, /readyz, /metrics, /status, /trigger) and the sampler that
// keeps the backlog gauges current on a schedule rather than on every
// scrape.
package ops

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/schedule"
)

// StatsSource counts the outbox.
type StatsSource interface {
	Stats(ctx context.Context, staleBefore time.Time) (mongo.Stats, error)
}

// HeldSource reads the held aggregates (see mongo.HeldStats).
type HeldSource interface {
	Held(ctx context.Context, now time.Time, failedHolds bool) (mongo.HeldStats, error)
}

// SampleScheduleDefault is how often the backlog gauges are refreshed.
const SampleScheduleDefault = "@every 15s"

// Sampler refreshes the backlog gauges on a schedule.
type Sampler struct {
	store      StatsSource
	now        func() time.Time
	staleAfter time.Duration
	metrics    *metrics.Metrics
	job        *schedule.Job
	// held, when set, keeps the held-aggregates gauges current too.
	held        HeldSource
	failedHolds bool
}

// TrackHeld makes the sampler keep the held-aggregates gauges current
// from src, FAILED events holding their aggregates when failedHolds
// (OUTBOX_ORDERING_AFTER_FAILED=wait). Call before Start.
func (s *Sampler) TrackHeld(src HeldSource, failedHolds bool) {
	s.held, s.failedHolds = src, failedHolds
}

// NewSampler returns a Sampler; Start runs it. now is the clock ages and
// the stale threshold are measured with: the database server's time
// (mongo.Clock.Now); nil is time.Now.
func NewSampler(store StatsSource, staleAfter time.Duration, spec string, now func() time.Time, m *metrics.Metrics, logger *slog.Logger) (*Sampler, error) {
	if spec == "" {
		spec = SampleScheduleDefault
	}
	if now == nil {
		now = time.Now
	}
	s := &Sampler{store: store, now: now, staleAfter: staleAfter, metrics: m}
	var err error
	if s.job, err = schedule.New("sampler", spec, s.runOnce, logger); err != nil {
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
	now := s.now().UTC()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := s.store.Stats(ctx, now.Add(-s.staleAfter))
	if err != nil {
		s.metrics.JobErrors.WithLabelValues("sampler").Inc()
		return false, fmt.Errorf("sample outbox stats: %w", err)
	}
	for _, status := range events.Statuses {
		s.metrics.Events.WithLabelValues(string(status)).Set(float64(st.Counts[status]))
	}
	s.metrics.OldestNewAge.Set(st.OldestNewAge(now).Seconds())
	s.metrics.StaleProcessing.Set(float64(st.Stale))
	if s.held != nil {
		h, err := s.held.Held(ctx, now, s.failedHolds)
		if err != nil {
			s.metrics.JobErrors.WithLabelValues("sampler").Inc()
			return false, fmt.Errorf("sample held aggregates: %w", err)
		}
		s.metrics.HeldAggregates.Set(float64(h.Aggregates))
		s.metrics.OldestHeldAge.Set(h.OldestAge(now).Seconds())
	}
	return false, nil
}
