// Package recovery resets events stuck in PROCESSING, because the worker
// that claimed them crashed, hung or lost its database, back to NEW so that
// another worker publishes them; and those whose processingAt could never
// go stale (missing, not a date, far in the future). Every replica runs it; each reset is one
// guarded write, so running it twice at once is harmless.
package recovery

import (
	"cmp"
	"context"
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

// Store is the outbox as recovery needs it.
type Store interface {
	// RecoverStale resets events PROCESSING since before staleBefore to
	// NEW, or to FAILED once they have used maxAttempts claims; and to NEW
	// the PROCESSING events whose processingAt could never go stale
	// (missing, not a date, or later than now by more than now -
	// staleBefore). reset counts both kinds.
	RecoverStale(ctx context.Context, staleBefore, now time.Time, maxAttempts int) (reset, failed int, err error)
}

const (
	// ScheduleDefault is how often recovery runs: every two minutes.
	ScheduleDefault = "*/2 * * * *"
	// StaleAfterDefault is how long a claim may stay PROCESSING: a minute.
	StaleAfterDefault = 60 * time.Second
	// runTimeout bounds one run, and is the server-side time limit
	// (maxTimeMS) of its writes: well under the default schedule's two
	// minutes, so that a run the database cannot serve ends, on the server
	// too, before the next begins. What a write reset before the limit
	// stays reset; the rest is left for the next run.
	runTimeout = 30 * time.Second
)

// Config configures a Recoverer.
type Config struct {
	// Schedule is the cron schedule of recovery runs. Defaults to ScheduleDefault.
	Schedule string
	// StaleAfter is how long an event may stay PROCESSING before it is
	// taken back. Keep it well above the claimer's publish timeout, or a
	// slow batch is taken back while its worker still publishes it.
	// Defaults to StaleAfterDefault.
	StaleAfter time.Duration
	// MaxAttempts: a stale event that has used this many claims becomes
	// FAILED instead of NEW, as the claimer fails an event whose publishes
	// have used them. Defaults to events.MaxAttemptsDefault, the claimer's
	// default too.
	MaxAttempts int
	// Archetype is the logger, the metrics and the clock. The stale test
	// reads Now: processingAt is written by the claiming worker against
	// the database server's clock, and a replica whose own clock is ahead
	// would otherwise take healthy claims back.
	service.Archetype
	// Yield, when set, says that claims are slow: scheduled runs are then
	// left out, more and more of them, but a run is never deferred by more
	// than StaleAfter plus one schedule period (see schedule.Config.Yield):
	// a stale claim waits for recovery at most twice the threshold plus two
	// periods (4 minutes at the default schedule). Recovery is what ends a claim
	// that a timed-out write landed after the claimer stopped releasing it,
	// so it yields for no longer than a claim may stand. Defaults to nil:
	// never yields.
	Yield func() bool
	// OnReset, when set, is called after a run that put stale events back
	// to NEW, so that they are claimed at once: the claims of an outbox
	// that only a dead replica's claims kept busy may be backing off for
	// idleness (claim.Config.IdleMax). Defaults to nil.
	OnReset func()
	// Margin is the largest jump of the database clock's offset recovery
	// goes on through (see ClockJumped): a claim stops publishing a
	// twentieth of StaleAfter before recovery may take it back, so a jump
	// within that cannot make recovery take back a claim still being
	// published. The worker passes the ownership's margin, which is the
	// same. Defaults to StaleAfter / MarginDivisorDefault.
	Margin time.Duration
}

// MarginDivisorDefault makes Margin default to StaleAfter divided by it.
const MarginDivisorDefault = 20

func (c *Config) setDefaults() {
	c.Schedule = cmp.Or(c.Schedule, ScheduleDefault)
	c.StaleAfter = cmp.Or(c.StaleAfter, StaleAfterDefault)
	c.Margin = cmp.Or(c.Margin, c.StaleAfter/MarginDivisorDefault)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, events.MaxAttemptsDefault)
	c.Archetype = c.Archetype.WithDefaults()
}

// Validate reports the first bad field, naming it and its value.
func (c Config) Validate() error {
	return rule.First("recovery",
		rule.Above("StaleAfter", c.StaleAfter, 0),
		rule.Above("Margin", c.Margin, 0),
		rule.AtLeast("MaxAttempts", c.MaxAttempts, 1),
		schedule.Rule("Schedule", c.Schedule),
	)
}

// Recoverer runs stale-claim recovery on a schedule.
type Recoverer struct {
	cfg   Config
	store Store
	job   *schedule.Job
	// jumpedUntil is the local instant (unix nanoseconds) until which
	// runs are left out after a jump of the database clock (ClockJumped).
	jumpedUntil atomic.Int64
}

// ClockJumped is told how far a new measurement of the database clock
// moved the server's time from what the last one predicted
// (mongo.Clock's OnJump). A jump larger than Margin, either way, leaves
// the runs out for StaleAfter: the processingAt of the claims written
// before it was read on a server time that moved, and a jump ahead would
// make healthy claims look stale, to be taken back while their workers
// still publish them (duplicates). By StaleAfter after the jump every
// such claim has been published or released by its worker, or is stale
// by any clock.
func (r *Recoverer) ClockJumped(jump time.Duration) {
	if jump <= r.cfg.Margin && jump >= -r.cfg.Margin {
		return
	}
	r.jumpedUntil.Store(r.cfg.Local().Add(r.cfg.StaleAfter).UnixNano())
	r.cfg.Logger.Warn("the database clock's offset jumped by more than the margin; recovery leaves its runs out for the stale threshold",
		"jump", jump.String(), "margin", r.cfg.Margin.String(), "stale_after", r.cfg.StaleAfter.String())
}

// New returns a Recoverer; Start runs it.
func New(store Store, cfg Config) (*Recoverer, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Recoverer{cfg: cfg, store: store}
	var err error
	if r.job, err = schedule.New(schedule.Config{
		Name: "recovery", Schedule: cfg.Schedule, Run: r.runOnce, Logger: cfg.Logger,
		Yield: cfg.Yield, YieldMax: cfg.StaleAfter, LeftOut: cfg.Metrics.RunsLeftOut.WithLabelValues("recovery").Inc,
	}); err != nil {
		return nil, err
	}
	return r, nil
}

// Start starts the schedule and returns.
func (r *Recoverer) Start(ctx context.Context) error { return r.job.Start(ctx) }

// Stop lets a run in flight finish. Idempotent; safe before Start.
func (r *Recoverer) Stop(ctx context.Context) error { return r.job.Stop(ctx) }

// LastRun is when the last successful run finished; zero before the first.
func (r *Recoverer) LastRun() time.Time { return r.job.LastRun() }

// Trigger runs recovery as soon as possible.
func (r *Recoverer) Trigger() { r.job.Trigger() }

func (r *Recoverer) runOnce(ctx context.Context) (bool, error) {
	if r.cfg.Local().UnixNano() < r.jumpedUntil.Load() {
		r.cfg.Metrics.RunsLeftOut.WithLabelValues("recovery").Inc()
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, runTimeout)
	defer cancel()
	now := r.cfg.Now().UTC()
	reset, failed, err := r.store.RecoverStale(ctx, now.Add(-r.cfg.StaleAfter), now, r.cfg.MaxAttempts)
	r.cfg.Metrics.Recovered.Add(float64(reset))
	r.cfg.Metrics.Failed.WithLabelValues(metrics.ReasonStaleMaxAttempts).Add(float64(failed))
	if err != nil {
		r.cfg.Metrics.JobErrors.WithLabelValues("recovery").Inc()
		return false, fmt.Errorf("recover stale events: %w", err)
	}
	if reset > 0 && r.cfg.OnReset != nil {
		r.cfg.OnReset()
	}
	level := slog.LevelDebug
	if reset > 0 || failed > 0 {
		level = slog.LevelWarn // stale claims mean a worker died or hung: worth a look
	}
	r.cfg.Logger.Log(ctx, level, "recovered stale events",
		"reset", reset, "failed", failed, "stale_after", r.cfg.StaleAfter.String())
	return false, nil
}
