// Package schedule runs a job on a cron schedule from one goroutine: ticks
// never overlap, a run that reports more work runs again at once (drain),
// Trigger runs it early (Wake too, unless runs are failing), ticks back
// off while runs keep failing or while the relay asks periodic work to
// yield (Config.Yield), ticks grow sparse while runs find nothing to do
// (Config.IdleSince), and Stop finishes
// the run in flight before it cancels it. The same goroutine times the
// ticks, so that a tick costs nothing while a run is in flight.
package schedule

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxrelay/outbox/internal/backoff"
	"github.com/outboxrelay/outbox/internal/rule"
	"github.com/robfig/cron/v3"
)

// Func is one run of a job. It returns more when work is left that should
// not wait for the next tick, such as a full batch.
type Func func(ctx context.Context) (more bool, err error)

// errorLogEvery bounds how often one job logs the same failure.
const errorLogEvery = 30 * time.Second

// After a failed run, ticks are skipped for backoffMin, doubling with each
// failure in a row up to backoffMax: a job whose database is down retries
// with backoff instead of on every tick. A success, or a Trigger, runs as
// usual; a Wake waits for the backoff like a tick. Schedules slower than
// backoffMax never notice.
const (
	backoffMin = time.Second
	backoffMax = 30 * time.Second
)

// While Config.Yield reports true, ticks are left out: one tick, then,
// after each run, twice as many as before, up to yieldTicksMax in a row. A
// job that runs every 15 s runs every 4 minutes while claims stay slow;
// one that runs every 2 minutes, every 32 minutes, were it not for
// YieldMaxDefault. Ticks left out never add up to a run deferred by more
// than Config.YieldMax, so that recovery and retention still run (less
// often) however long claims stay slow.
const (
	yieldTicksMax = 16
	// YieldMaxDefault is Config.YieldMax's default: well above the
	// schedules of the periodic jobs (15 s to 2 minutes), so that yielding
	// takes most of their load off a slow database, and short enough that
	// stale claims are still recovered within minutes.
	YieldMaxDefault = 10 * time.Minute
)

// IdleMaxDefault is Config.IdleMax's default: an idle job runs at least
// once a minute.
const IdleMaxDefault = time.Minute

// Parse checks a schedule: five cron fields or a descriptor such as
// "@every 1s", "@every 100ms" or "@hourly".
func Parse(spec string) (cron.Schedule, error) {
	s, err := parse(spec)
	if err != nil {
		return nil, fmt.Errorf("schedule %q: %w", spec, err)
	}
	return s, nil
}

// Rule is the rule of a Config field that holds a schedule, for a
// Validate: the spec parses.
func Rule(name, spec string) *rule.Error {
	if _, err := parse(spec); err != nil {
		return &rule.Error{Field: name, Value: spec, Want: "a schedule such as */2 * * * * or @every 1s (" + err.Error() + ")"}
	}
	return nil
}

func parse(spec string) (cron.Schedule, error) {
	// cron's own @every rounds a delay down to whole seconds (and up to at
	// least one), so "@every 100ms" would tick once a second, and it ticks
	// on whole seconds of the wall clock, so every replica would claim at
	// the same instant and race for the same batch. @every gets a schedule
	// that keeps its delay to the nanosecond, counted from the job's start:
	// replicas started at different moments tick at different moments.
	if d, ok := strings.CutPrefix(spec, "@every "); ok {
		if every, err := time.ParseDuration(strings.TrimSpace(d)); err == nil {
			if every <= 0 {
				return nil, errors.New("want a delay above zero")
			}
			return constantDelay(every), nil
		}
	}
	return cron.ParseStandard(spec)
}

// constantDelay ticks every so often, to the nanosecond.
type constantDelay time.Duration

// Next implements cron.Schedule.
func (d constantDelay) Next(t time.Time) time.Time { return t.Add(time.Duration(d)) }

// Config configures a Job.
type Config struct {
	// Name names the job in its logs (key "job"). Required.
	Name string
	// Schedule is when the job runs: five cron fields or a descriptor
	// such as "@every 1s" (see Parse). Required.
	Schedule string
	// Run is one run of the job. Required.
	Run Func
	// RunAtStart runs the job once as soon as it starts, without waiting
	// for the first tick. Defaults to false.
	RunAtStart bool
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Yield, when set, is asked at each tick whether the job should leave
	// the run out, because the relay's own work (claims) is slow: while
	// it says so, ticks are left out, more of them after each run (see
	// yieldTicksMax), but never for longer than YieldMax in a row. A
	// Trigger is not a tick: it runs whatever Yield says. Defaults to nil:
	// never yields.
	Yield func() bool
	// YieldMax bounds how long ticks are left out in a row: the first
	// tick at or after YieldMax since the first one left out runs. So a
	// run is deferred by at most YieldMax plus one schedule period.
	// Zero means YieldMaxDefault.
	YieldMax time.Duration
	// LeftOut, when set, is called for each tick left out because of
	// Yield (for a metric). Defaults to nil.
	LeftOut func()
	// IdleSince, when set, is asked at each tick since when the job's
	// runs have found nothing to do, zero while they find work. While it
	// is set, ticks are left out so that the gaps between runs grow with
	// the time idle: a tick runs once the time since the last run is at
	// least half the time idle (see idleGap), and never later than
	// IdleMax after the last run. Runs then come 1, 2, 4, 8, ... ticks
	// apart, and a job that idles for an hour costs a run per IdleMax
	// instead of one per tick. A Trigger is not a tick: it runs at once,
	// and a run that finds work clears IdleSince, which brings the
	// schedule back. Defaults to nil: never backs off for idleness.
	IdleSince func() time.Time
	// IdleMax is the longest gap between runs while idle; the wait of the
	// first event after a long idle is bounded by it plus a tick. Zero
	// means IdleMaxDefault.
	IdleMax time.Duration
	// CancelOnStop cancels a run in flight as soon as Stop is called,
	// for a job whose runs only read (a gauge's sample): it has nothing
	// to finish, and on a slow database its read would otherwise hold
	// the worker's shutdown up to Stop's deadline. Defaults to false: a
	// run that writes is let finish until the deadline.
	CancelOnStop bool
}

// Validate reports the first bad field, naming it and its value.
func (c Config) Validate() error {
	return rule.First("schedule",
		rule.Required("Name", c.Name != ""),
		Rule("Schedule", c.Schedule),
		rule.Required("Run", c.Run != nil),
		rule.Check("YieldMax", c.YieldMax >= 0, c.YieldMax, "0 (the default) or more"),
		rule.Check("IdleMax", c.IdleMax >= 0, c.IdleMax, "0 (the default) or more"),
	)
}

// Job runs a Func on a schedule.
type Job struct {
	cfg      Config
	schedule cron.Schedule
	logger   *slog.Logger

	wake     chan struct{}
	stopping chan struct{}
	done     chan struct{}
	cancel   context.CancelFunc

	startOnce, stopOnce sync.Once
	lastRun             atomic.Int64 // unix nanoseconds of the last successful run
	lastErr             errorLog
	failures            int          // failed runs in a row; the loop's own
	retryAt             atomic.Int64 // unix nanoseconds before which ticks are skipped
	yield               yieldState
	lastStart           atomic.Int64 // unix nanoseconds of the last run's start, of any kind
	now                 func() time.Time
}

// yieldState is the backoff of ticks while Config.Yield says so. Ticks
// come from the cron's goroutines, hence the lock.
type yieldState struct {
	mu sync.Mutex
	// gap is how many ticks in a row are left out before the next run;
	// 0 while the job does not yield.
	gap int
	// left counts the ticks left out since the last run, the first of
	// them at since.
	left  int
	since time.Time
}

// New returns a Job; Start runs it.
func New(cfg Config) (*Job, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.YieldMax == 0 {
		cfg.YieldMax = YieldMaxDefault
	}
	if cfg.IdleMax == 0 {
		cfg.IdleMax = IdleMaxDefault
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s, _ := parse(cfg.Schedule) // Validate has parsed it
	return &Job{
		cfg:      cfg,
		schedule: s,
		logger:   cfg.Logger.With("job", cfg.Name),
		wake:     make(chan struct{}, 1),
		stopping: make(chan struct{}),
		done:     make(chan struct{}),
		now:      time.Now,
	}, nil
}

// Start starts the schedule, and a first run if RunAtStart, and returns.
// Runs get a context that outlives ctx's cancellation; Stop ends them.
func (j *Job) Start(ctx context.Context) error {
	j.startOnce.Do(func() {
		var runCtx context.Context
		runCtx, j.cancel = context.WithCancel(context.WithoutCancel(ctx))
		ticks := newTicks(j.schedule, j.now())
		go j.loop(runCtx, ticks)
		if j.cfg.RunAtStart {
			j.Trigger()
		}
	})
	return nil
}

// Trigger asks for a run as soon as the current one, if any, is over.
// Triggers while a run is pending collapse into one.
func (j *Job) Trigger() {
	select {
	case j.wake <- struct{}{}:
	default:
	}
}

// Wake asks for a run as Trigger does, unless the job is backing off after
// failed runs: then it asks for nothing and returns how long the backoff
// has left, and the first tick after it runs. It is for requests from
// outside the worker (POST /trigger): each would otherwise be one more run
// against a database that the backoff spares while it fails.
func (j *Job) Wake() (backoffLeft time.Duration) {
	if left := time.Duration(j.retryAt.Load() - j.now().UnixNano()); left > 0 {
		return left
	}
	j.Trigger()
	return 0
}

// tick is the schedule's wake-up: a Trigger, unless the job is backing off
// after failed runs or yields to the relay.
func (j *Job) tick() {
	now := j.now()
	if now.UnixNano() < j.retryAt.Load() {
		return
	}
	if j.idles(now) {
		return
	}
	if j.yields(now) {
		if j.cfg.LeftOut != nil {
			j.cfg.LeftOut()
		}
		return
	}
	j.Trigger()
}

// yields reports whether the tick at now is left out. While Yield says so,
// the job leaves out gap ticks, runs one, and doubles gap (1, 2, 4, ... up
// to yieldTicksMax); the tick at or after YieldMax since the first tick
// left out runs, whatever gap says: liveness. When Yield says no, the tick
// runs and the backoff is over.
func (j *Job) yields(now time.Time) bool {
	if j.cfg.Yield == nil {
		return false
	}
	y := &j.yield
	y.mu.Lock()
	defer y.mu.Unlock()
	if !j.cfg.Yield() {
		y.gap, y.left, y.since = 0, 0, time.Time{}
		return false
	}
	if y.gap == 0 {
		y.gap = 1
	}
	if y.left >= y.gap || (y.left > 0 && now.Sub(y.since) >= j.cfg.YieldMax) {
		y.gap = min(2*y.gap, yieldTicksMax)
		y.left, y.since = 0, time.Time{}
		return false
	}
	if y.left == 0 {
		y.since = now
	}
	y.left++
	return true
}

// idles reports whether the tick at now is left out because the job is
// idle (Config.IdleSince).
func (j *Job) idles(now time.Time) bool {
	if j.cfg.IdleSince == nil {
		return false
	}
	since := j.cfg.IdleSince()
	if since.IsZero() {
		return false
	}
	return now.Sub(time.Unix(0, j.lastStart.Load())) < idleGap(now.Sub(since), j.cfg.IdleMax)
}

// idleGap is the least time between two runs of a job idle for idle: half
// of it, so that runs come at twice the time idle each (1, 2, 4, 8 ...
// ticks), at most idleMax. A twentieth less: a run starts a little after its
// tick, and the next tick, a whole number of periods later, must not miss
// the gap by that little and wait one more period.
func idleGap(idle, idleMax time.Duration) time.Duration {
	return min(idle/2, idleMax) * 19 / 20
}

// LastRun is when the last successful run finished: one that returned no
// error and did not panic. Zero before the first.
func (j *Job) LastRun() time.Time {
	n := j.lastRun.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// Stop stops the schedule, lets the run in flight finish, and returns. If
// ctx ends first it cancels the run, waits for it to return, and returns
// ctx.Err(). Stop is idempotent and safe before Start.
func (j *Job) Stop(ctx context.Context) error {
	j.stopOnce.Do(func() {
		close(j.stopping)
		j.startOnce.Do(func() { close(j.done) }) // never started: nothing to wait for
	})
	if j.cfg.CancelOnStop && j.cancel != nil {
		j.cancel()
	}
	select {
	case <-j.done:
		return nil
	case <-ctx.Done():
	}
	if j.cancel != nil {
		j.cancel()
	}
	<-j.done
	return ctx.Err()
}

func (j *Job) loop(ctx context.Context, ticks *ticks) {
	defer close(j.done)
	defer j.cancel()
	defer ticks.stop()
	for {
		select {
		case <-j.stopping:
			return
		case <-j.wake:
		case <-ticks.wait(j.now()):
			if ticks.passed(j.now()) {
				j.tick()
			}
			continue
		}
		// A select picks at random among ready cases: a Trigger pending
		// when Stop is called must not start a run.
		select {
		case <-j.stopping:
			return
		default:
		}
		for j.runOnce(ctx) {
			select {
			case <-j.stopping:
				return
			default:
			}
		}
	}
}

// ticks times a Job's ticks in its loop's goroutine. While a run is in
// flight nothing waits on the timer, so nothing wakes up for the ticks
// that fall meanwhile: with "@every 100ms" and claims that each wait
// seconds on the database, those wake-ups (a goroutine each, on a
// separate timer loop) were a large share of the worker's CPU. They
// collapse into one tick, which the loop meets as soon as the run ends
// (the timer is then already due), as it would a Trigger sent during it.
type ticks struct {
	schedule cron.Schedule
	next     time.Time // of the next tick; zero when the schedule has none
	timer    *time.Timer
}

func newTicks(s cron.Schedule, now time.Time) *ticks {
	// Cron fields are read in UTC, whatever the machine's time zone.
	return &ticks{schedule: s, next: s.Next(now.UTC())}
}

// wait returns a channel that receives at the next tick, or nil (which
// never receives) when there is none.
func (t *ticks) wait(now time.Time) <-chan time.Time {
	if t.next.IsZero() {
		return nil
	}
	d := t.next.Sub(now)
	if t.timer == nil {
		t.timer = time.NewTimer(d)
	} else {
		t.timer.Reset(d)
	}
	return t.timer.C
}

// passed reports whether the next tick's time has come by now, and if so
// moves on to the tick after now.
func (t *ticks) passed(now time.Time) bool {
	if t.next.IsZero() || now.Before(t.next) {
		return false
	}
	t.next = t.schedule.Next(now.UTC())
	return true
}

func (t *ticks) stop() {
	if t.timer != nil {
		t.timer.Stop()
	}
}

// runOnce calls run, logs its error, and survives its panic: a bug in one
// run must not take the worker down; what it had claimed is recovered.
func (j *Job) runOnce(ctx context.Context) (more bool) {
	failed := true
	j.lastStart.Store(j.now().UnixNano())
	defer func() {
		if p := recover(); p != nil {
			j.logger.Error("job panicked", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			more = false
		}
		j.record(failed)
	}()
	more, err := j.cfg.Run(ctx)
	if err != nil && !errors.Is(err, context.Canceled) {
		j.lastErr.log(j.logger, err, skipFor(j.failures+1))
		return false
	}
	failed = false
	return more
}

// record notes the outcome of a run: a success is the last run and ends any
// backoff; a failure pushes the next tick back.
func (j *Job) record(failed bool) {
	now := j.now()
	if !failed {
		j.failures = 0
		j.retryAt.Store(0)
		j.lastRun.Store(now.UnixNano())
		return
	}
	j.failures++
	j.retryAt.Store(now.Add(skipFor(j.failures)).UnixNano())
}

// skipFor is how long ticks are skipped after n failed runs in a row. No
// jitter: each replica's schedule already ticks at its own moments.
func skipFor(n int) time.Duration {
	return backoff.Delay(max(n-1, 0), backoffMin, backoffMax)
}

// errorLog logs a repeated error at most once per errorLogEvery, with the
// number of times it was suppressed in between.
type errorLog struct {
	mu         sync.Mutex
	last       string
	lastLogged time.Time
	suppressed int
}

func (l *errorLog) log(logger *slog.Logger, err error, retryIn time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	msg := err.Error()
	if msg == l.last && time.Since(l.lastLogged) < errorLogEvery {
		l.suppressed++
		return
	}
	logger.Error("job run failed", "error", err, "suppressed", l.suppressed, "retry_in", retryIn.String())
	l.last, l.lastLogged, l.suppressed = msg, time.Now(), 0
}
