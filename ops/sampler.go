// Package ops is the worker's operations surface: the HTTP endpoints
// (/healthz, /readyz, /metrics, /status, /trigger) and the sampler that
// keeps the backlog gauges and /status current on a schedule rather than
// on every scrape or request.
package ops

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/rule"
	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/schedule"
	"github.com/outboxrelay/outbox/service"
)

// StatsSource counts the outbox.
type StatsSource interface {
	Stats(ctx context.Context, staleBefore time.Time) (events.Stats, error)
}

// HeldSource reads the aggregates held by ordering.
type HeldSource interface {
	Held(ctx context.Context, now time.Time, failedHolds bool) (events.HeldStats, error)
}

// FailuresSource groups the FAILED events by cause (mongo.Store).
type FailuresSource interface {
	FailureGroups(ctx context.Context, now time.Time, limit int) (events.FailureGroups, error)
}

// HoldersSource lists the events that hold their aggregates (mongo.Store).
type HoldersSource interface {
	Holders(ctx context.Context, now time.Time, failedHolds bool, limit int) ([]events.Holder, bool, error)
}

// PausedSource reads the event types an operator paused.
type PausedSource interface {
	PausedTypes(ctx context.Context) ([]events.Pause, error)
}

const (
	// SampleScheduleDefault is how often the backlog gauges are refreshed.
	SampleScheduleDefault = "@every 15s"
	// SampleIdleMaxDefault is the longest gap between samples of an idle
	// outbox (SamplerConfig.IdleSince): its seven commands once per two
	// minutes instead of four times a minute.
	SampleIdleMaxDefault = 2 * time.Minute
	// sampleTimeout bounds one sample, so that a hung database leaves the
	// gauges at their last value rather than stalling the schedule. Each of
	// the sample's commands carries what is left of it as its server-side
	// time limit (maxTimeMS), so that a sample given up on stops costing
	// the database too.
	sampleTimeout = 10 * time.Second
	// sampleTimeoutGrowth is how many times SamplerConfig.Timeout a
	// read's time grows to at most after reads that ran out of it
	// (Sampler.grant).
	sampleTimeoutGrowth = 8
	// onDemandEvery is how old the last sample of a replica that does not
	// sample on schedule may be before a /status request asks for a new
	// one: as often as the leader samples by default, so that however
	// often /status is read, a replica adds at most one sample per period.
	onDemandEvery = 15 * time.Second
	// FailureGroupsLimit is how many FAILED events, the newest, a read
	// of the failure groups groups.
	FailureGroupsLimit = 5000
	// HoldersLimit is how many held aggregates a read of their holders
	// lists.
	HoldersLimit = 500
)

// Sample is what one sample of the outbox found. /status answers from the
// last one.
type Sample struct {
	// At is when the sample was taken, by the database server's clock
	// (SamplerConfig.Now): ages below are as of At.
	At    time.Time
	Stats events.Stats
	// Held is the held aggregates, when the sampler reads them
	// (SamplerConfig.Held), as of HeldAt: an earlier sample's, when this
	// one's read of them failed, or nil before the first.
	Held   *events.HeldStats
	HeldAt time.Time
	// Paused is the paused event types, by type, when the sampler reads
	// them (SamplerConfig.Paused); nil otherwise.
	Paused []events.Pause
}

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
	// Paused, when set, keeps the paused types current too: in the
	// sample (/status) and the paused-types gauge.
	Paused PausedSource
	// Failures, when set, keeps the failure groups current too
	// (LatestGroups), for the console's failures page and the first page
	// of its FAILED list: read before the counts, under a time limit of
	// their own, so that neither failing stops the other. The worker
	// leaves it unset.
	Failures FailuresSource
	// Holders, when set with Held, keeps the list of the held
	// aggregates' holders current too (LatestHolders), for the console's
	// held page, as Failures does the groups.
	Holders HoldersSource
	// Active, when set, says whether this replica samples: the gauges
	// describe the whole outbox, so one replica (the ownership leader)
	// samples for all of them, and the others export none of them rather
	// than repeat the same queries; while no replica leads, every one
	// samples (the worker's wiring). Defaults to nil: always samples.
	Active func() bool
	// Archetype is the logger, the metrics (which receive the gauges) and
	// the clock ages and the stale threshold are measured with.
	service.Archetype
	// Timeout is the time each read of a sample has at first (see
	// Sampler.grant). Defaults to 10 s.
	Timeout time.Duration
	// Yield, when set, says that claims are slow: scheduled samples are
	// then left out, more and more of them (schedule.Config.Yield), and a
	// replica that does not lead takes none for /status. Defaults to nil:
	// never yields.
	Yield func() bool
	// IdleSince, when set, says since when the outbox's claims have found
	// nothing to claim (claim.Claimer.IdleSince): scheduled samples then
	// back off, 1, 2, 4 ... ticks apart up to IdleMax
	// (schedule.Config.IdleSince). An outbox whose claims find nothing
	// has no backlog to watch; its gauges stay as last sampled, and the
	// first claim that finds events brings the schedule back. Defaults to
	// nil: samples on every tick.
	IdleSince func() time.Time
	// IdleMax is the longest gap between samples while IdleSince is set.
	// Defaults to SampleIdleMaxDefault.
	IdleMax time.Duration
}

func (c *SamplerConfig) setDefaults() {
	c.Schedule = cmp.Or(c.Schedule, SampleScheduleDefault)
	c.Timeout = cmp.Or(c.Timeout, sampleTimeout)
	c.IdleMax = cmp.Or(c.IdleMax, SampleIdleMaxDefault)
	c.Archetype = c.Archetype.WithDefaults()
}

// Validate reports the first bad field, naming it and its value.
func (c SamplerConfig) Validate() error {
	return rule.First("ops sampler",
		rule.Required("Store", c.Store != nil),
		rule.Above("StaleAfter", c.StaleAfter, 0),
		rule.Above("Timeout", c.Timeout, 0),
		schedule.Rule("Schedule", c.Schedule),
	)
}

// Sampler refreshes the backlog gauges on a schedule, and keeps the last
// sample for /status.
type Sampler struct {
	cfg  SamplerConfig
	job  *schedule.Job
	last atomic.Pointer[Sample]
	// groups is the last read of the failure groups (Failures).
	groups atomic.Pointer[events.FailureGroups]
	// holders is the last read of the held aggregates' holders (Holders).
	holders atomic.Pointer[events.Holders]
	// wanted says that /status asked a replica that does not lead for a
	// sample.
	wanted atomic.Bool
	// limit is each read's time in the next sample, ranOut whether a
	// read of this one ran out of it (see grant).
	limit  atomic.Int64
	ranOut atomic.Bool
}

// NewSampler returns a Sampler; Start runs it.
func NewSampler(cfg SamplerConfig) (*Sampler, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Sampler{cfg: cfg}
	var err error
	if s.job, err = schedule.New(schedule.Config{
		Name: "sampler", Schedule: cfg.Schedule, Run: s.runOnce, RunAtStart: true, Logger: cfg.Logger,
		// A sample only reads: a stop need not wait for it.
		CancelOnStop: true,
		Yield:        cfg.Yield, LeftOut: cfg.Metrics.RunsLeftOut.WithLabelValues("sampler").Inc,
		IdleSince: cfg.IdleSince, IdleMax: cfg.IdleMax,
	}); err != nil {
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

// Latest returns the last sample, and false before the first. A replica
// that does not lead samples only when asked: Latest asks (for a later
// call) when its sample is missing or older than onDemandEvery.
func (s *Sampler) Latest() (Sample, bool) {
	last := s.last.Load()
	if !s.active() && (last == nil || s.cfg.Now().Sub(last.At) >= onDemandEvery) {
		s.wanted.Store(true)
		s.job.Trigger()
	}
	if last == nil {
		return Sample{}, false
	}
	return *last, true
}

// fresh reports whether the last sample is younger than onDemandEvery.
func (s *Sampler) fresh() bool {
	last := s.last.Load()
	return last != nil && s.cfg.Now().Sub(last.At) < onDemandEvery
}

func (s *Sampler) active() bool { return s.cfg.Active == nil || s.cfg.Active() }

// LatestGroups returns the failure groups last read (SamplerConfig.Failures),
// and false before the first read.
func (s *Sampler) LatestGroups() (events.FailureGroups, bool) {
	g := s.groups.Load()
	if g == nil {
		return events.FailureGroups{}, false
	}
	return *g, true
}

// LatestHolders returns the held aggregates' holders last read
// (SamplerConfig.Holders), and false before the first read.
func (s *Sampler) LatestHolders() (events.Holders, bool) {
	h := s.holders.Load()
	if h == nil {
		return events.Holders{}, false
	}
	return *h, true
}

// readLists reads the lists the sampler keeps for the console (the
// failure groups, the holders), each under sampleTimeout of its own.
func (s *Sampler) readLists(ctx context.Context) error {
	var errs []error
	if s.cfg.Failures != nil {
		rctx, cancel := context.WithTimeout(ctx, sampleTimeout)
		g, err := s.cfg.Failures.FailureGroups(rctx, s.cfg.Now().UTC(), FailureGroupsLimit)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("sample failure groups: %w", err))
		} else {
			s.groups.Store(&g)
		}
	}
	if s.cfg.Holders != nil && s.cfg.Held != nil {
		now := s.cfg.Now().UTC()
		rctx, cancel := context.WithTimeout(ctx, sampleTimeout)
		list, capped, err := s.cfg.Holders.Holders(rctx, now, s.cfg.FailedHolds, HoldersLimit)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("sample held aggregates' holders: %w", err))
		} else {
			s.holders.Store(&events.Holders{At: now, List: list, Capped: capped})
		}
	}
	if len(errs) > 0 {
		s.cfg.Metrics.JobErrors.WithLabelValues("sampler").Inc()
	}
	return errors.Join(errs...)
}

func (s *Sampler) runOnce(ctx context.Context) (bool, error) {
	active := s.active()
	if !active {
		s.clear()
		// Not leading: a sample only for /status, when it asked, and not
		// while claims are slow, nor when the last is younger than
		// onDemandEvery (a request made while a sample ran triggers
		// another run, which that sample already answers).
		if !s.wanted.Swap(false) || (s.cfg.Yield != nil && s.cfg.Yield()) || s.fresh() {
			return false, nil
		}
	}
	// The console's lists first: after an action triggered this sample,
	// its pages read at each view until they are read again, and the
	// counts may take their whole time limit on a slow database.
	var listsErr error
	if active {
		listsErr = s.readLists(ctx)
	}
	sample, err := s.sample(ctx)
	if err != nil {
		s.cfg.Metrics.JobErrors.WithLabelValues("sampler").Inc()
		return false, errors.Join(err, listsErr)
	}
	// The gauges first: once Latest has a sample, /metrics shows it too.
	if active {
		s.setGauges(sample)
	}
	s.last.Store(&sample)
	return false, listsErr
}

// sample reads the outbox's figures, each of its reads (the counts, the
// held aggregates, the paused types) under a time limit of its own (grant), so
// that a slow one leaves the others their time. The counts are the
// sample: without them it fails. A held read that fails gives way: the
// sample keeps the last one read (Sample.HeldAt says when), as the
// gauges do, and says why in the log.
func (s *Sampler) sample(ctx context.Context) (Sample, error) {
	defer s.adapt()
	now := s.cfg.Now().UTC()
	st, err := within(ctx, s, func(ctx context.Context) (events.Stats, error) {
		return s.cfg.Store.Stats(ctx, now.Add(-s.cfg.StaleAfter))
	})
	if err != nil {
		return Sample{}, fmt.Errorf("sample outbox stats: %w", err)
	}
	sample := Sample{At: now, Stats: st}
	if s.cfg.Held != nil {
		s.sampleHeld(ctx, &sample)
	}
	if s.cfg.Paused != nil {
		p, err := within(ctx, s, s.cfg.Paused.PausedTypes)
		if err != nil {
			return Sample{}, fmt.Errorf("sample paused types: %w", err)
		}
		sample.Paused = p
	}
	return sample, nil
}

// sampleHeld reads the held aggregates into sample, or keeps the last
// sample's when the read fails (or none, before the first).
func (s *Sampler) sampleHeld(ctx context.Context, sample *Sample) {
	h, err := within(ctx, s, func(ctx context.Context) (events.HeldStats, error) {
		return s.cfg.Held.Held(ctx, sample.At, s.cfg.FailedHolds)
	})
	if err == nil {
		sample.Held, sample.HeldAt = &h, sample.At
		return
	}
	s.cfg.Metrics.JobErrors.WithLabelValues("sampler").Inc()
	if last := s.last.Load(); last != nil && last.Held != nil {
		sample.Held, sample.HeldAt = last.Held, last.HeldAt
	}
	if sample.Held == nil {
		s.cfg.Logger.WarnContext(ctx, "sampler: held aggregates not read; none read yet", slog.String("error", err.Error()))
		return
	}
	s.cfg.Logger.WarnContext(ctx, "sampler: held aggregates not read; the last read stands",
		slog.Time("readAt", sample.HeldAt), slog.String("error", err.Error()))
}

// within runs read under the sample's time limit (grant), and notes a
// read that ran out of it.
func within[T any](ctx context.Context, s *Sampler, read func(context.Context) (T, error)) (T, error) {
	grant, start := s.grant(), time.Now()
	rctx, cancel := context.WithTimeout(ctx, grant)
	defer cancel()
	v, err := read(rctx)
	// Ran out: failed after (nearly) all its time. The server gives up at
	// the maxTimeMS the driver derives from the deadline, a round trip
	// before it, so the context may not have expired yet.
	if err != nil && ctx.Err() == nil && time.Since(start) >= grant*9/10 {
		s.ranOut.Store(true)
	}
	return v, err
}

// grant is the time a read of the sample may take: SamplerConfig.Timeout,
// twice as long after each sample with a read that ran out of it, up to
// sampleTimeoutGrowth times as long, and back by halves after samples
// without. A database
// that cannot count the backlog in 10 s (FerretDB decodes every
// unpublished event to count them: behind 50,000, beside four replicas'
// claims, that took longer) then gets the time it needs, rather than fail
// every run; the runs come no oftener than the schedule, one at a time,
// and yield to slow claims.
func (s *Sampler) grant() time.Duration {
	if d := time.Duration(s.limit.Load()); d > 0 {
		return d
	}
	return s.cfg.Timeout
}

// adapt sets the next sample's grant from whether a read of this one ran
// out of its time.
func (s *Sampler) adapt() {
	d := s.grant()
	if s.ranOut.Swap(false) {
		d = min(2*d, sampleTimeoutGrowth*s.cfg.Timeout)
	} else {
		d = max(d/2, s.cfg.Timeout)
	}
	s.limit.Store(int64(d))
}

// setGauges exports a sample.
func (s *Sampler) setGauges(sample Sample) {
	m := s.cfg.Metrics
	for _, status := range events.CountedStatuses {
		m.Events.WithLabelValues(string(status)).Set(float64(sample.Stats.Counts[status]))
	}
	m.OldestNewAge.Set(sample.Stats.OldestNewAge(sample.At).Seconds())
	m.StaleProcessing.Set(float64(sample.Stats.Stale))
	if h := sample.Held; h != nil {
		m.HeldAggregates.Set(float64(h.Aggregates))
		m.OldestHeldAge.Set(h.OldestAge(sample.At).Seconds())
	}
	if s.cfg.Paused != nil {
		m.PausedTypes.Set(float64(len(sample.Paused)))
	}
}

// clear withdraws the gauges of a replica that does not sample.
func (s *Sampler) clear() {
	m := s.cfg.Metrics
	m.Events.Reset()
	for _, g := range []metrics.Sampled{m.OldestNewAge, m.StaleProcessing, m.HeldAggregates, m.OldestHeldAge, m.PausedTypes} {
		g.Clear()
	}
}
