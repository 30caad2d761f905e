package schedule

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestTicksBackOffAfterFailures drives the loop's two halves by hand, with
// a fake clock: runOnce records each outcome, tick decides whether the
// schedule's wake-up becomes a run.
func TestTicksBackOffAfterFailures(t *testing.T) {
	t.Parallel()
	fail := true
	j, err := New(Config{Name: "test", Schedule: "@every 1s", Run: func(context.Context) (bool, error) {
		if fail {
			return false, errors.New("database down")
		}
		return false, nil
	}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	j.now = func() time.Time { return now }
	// woken reports whether a tick at now would run the job.
	woken := func() bool { return tickWakes(j) }

	// Failures in a row push ticks back 1s, 2s, 4s, ... up to backoffMax.
	for n, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, backoffMax, backoffMax} {
		if !woken() {
			t.Fatalf("after %d failures and their backoff: tick did not run the job", n)
		}
		j.runOnce(t.Context())
		now = now.Add(want - time.Millisecond)
		if woken() {
			t.Errorf("failure %d: a tick %s later ran the job, want it skipped until %s", n+1, want-time.Millisecond, want)
		}
		now = now.Add(time.Millisecond)
	}
	if !j.LastRun().IsZero() {
		t.Errorf("LastRun after failed runs only = %s, want zero", j.LastRun())
	}

	// A Wake waits for the backoff as a tick does, and says how long is
	// left of it.
	j.runOnce(t.Context())
	if left := j.Wake(); left != backoffMax || woke(j) {
		t.Errorf("Wake at the start of a %s backoff = %s (woke the job: %t), want %s left and no run", backoffMax, left, woke(j), backoffMax)
	}
	now = now.Add(backoffMax - time.Second)
	if left := j.Wake(); left != time.Second || woke(j) {
		t.Errorf("Wake a second before the backoff ends = %s, want 1s left and no run", left)
	}
	now = now.Add(-backoffMax + time.Second)

	// A Trigger is not a tick: it runs at once, and a success ends the backoff.
	j.Trigger()
	if !woke(j) {
		t.Fatal("Trigger during a backoff did not wake the job")
	}
	fail = false
	j.runOnce(t.Context())
	if got := j.LastRun(); !got.Equal(now) {
		t.Errorf("LastRun after a success = %s, want %s", got, now)
	}
	if !woken() {
		t.Error("tick right after a successful run did not run the job")
	}
	if left := j.Wake(); left != 0 || !woke(j) {
		t.Errorf("Wake after a successful run = %s left, want 0 and a run", left)
	}
}

// TestRunOnceMore checks what the loop is told after each kind of run: only
// a successful run may ask for more, so a failing or panicking run that
// said more cannot spin the loop.
func TestRunOnceMore(t *testing.T) {
	t.Parallel()
	for name, tt := range map[string]struct {
		run  Func
		want bool
	}{
		"success with more":    {func(context.Context) (bool, error) { return true, nil }, true},
		"success without more": {func(context.Context) (bool, error) { return false, nil }, false},
		"error with more":      {func(context.Context) (bool, error) { return true, errors.New("claim failed") }, false},
		"panic": {func(context.Context) (bool, error) {
			panic("bug in a run")
		}, false},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			j, err := New(Config{Name: "test", Schedule: "@every 1h", Run: tt.run, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			if got := j.runOnce(t.Context()); got != tt.want {
				t.Errorf("runOnce = %t, want %t", got, tt.want)
			}
		})
	}
}

// No run starts once Stop has been called: not the next run of a drain
// that reported more, and not a Trigger that was pending. (A select among
// ready cases picks at random, so each case runs many times.)
func TestNoRunAfterStop(t *testing.T) {
	t.Parallel()
	for _, more := range []bool{true, false} {
		for range 32 {
			var j *Job
			runs := 0
			started := make(chan struct{}, 1)
			j, err := New(Config{Name: "test", Schedule: "@every 1h", Run: func(context.Context) (bool, error) {
				runs++
				started <- struct{}{}
				<-j.stopping // the run in flight when the stop comes
				j.Trigger()
				return more, nil
			}, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			if err := j.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			j.Trigger()
			select {
			case <-started:
			case <-time.After(10 * time.Second):
				t.Fatal("the first run never started")
			}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			err = j.Stop(ctx)
			cancel()
			if err != nil {
				t.Fatalf("Stop: %v", err)
			}
			if runs != 1 {
				t.Fatalf("runs = %d after a stop during the first run (more %t), want 1", runs, more)
			}
		}
	}
}

// TestTicksYieldWhileClaimsAreSlow drives tick by hand with a fake clock:
// while Yield says so, ticks are left out, one, then two, then four...
// between runs, up to yieldTicksMax; a Trigger still runs; and once Yield
// says no, the next tick runs.
func TestTicksYieldWhileClaimsAreSlow(t *testing.T) {
	t.Parallel()
	slow, leftOut := true, 0
	j, err := New(Config{Name: "test", Schedule: "@every 1s", Run: func(context.Context) (bool, error) { return false, nil },
		Yield: func() bool { return slow }, YieldMax: time.Hour, LeftOut: func() { leftOut++ },
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	j.now = func() time.Time { return now }
	woken := func() bool {
		now = now.Add(time.Second)
		return tickWakes(j)
	}
	// The ticks left out before each run while claims stay slow.
	var gaps []int
	for range 7 {
		gap := 0
		for !woken() {
			gap++
			if gap > 100 {
				t.Fatalf("100 ticks in a row left out; runs so far after %v", gaps)
			}
		}
		gaps = append(gaps, gap)
	}
	if diff := cmp.Diff([]int{1, 2, 4, 8, 16, 16, 16}, gaps); diff != "" {
		t.Errorf("ticks left out before each run while claims are slow (-want +got):\n%s", diff)
	}
	if want := 1 + 2 + 4 + 8 + 16*3; leftOut != want {
		t.Errorf("LeftOut called %d times, want %d (once per tick left out)", leftOut, want)
	}

	if woken() {
		t.Fatal("the tick after a run was not left out")
	}
	j.Trigger()
	if !woke(j) {
		t.Error("a Trigger while yielding did not wake the job: only ticks yield")
	}

	slow = false
	if !woken() {
		t.Error("the first tick once claims are fast again was left out")
	}
	slow = true
	if woken() {
		t.Error("claims slow again: the first tick ran, want the backoff to start again at one tick")
	}
	if !woken() {
		t.Error("claims slow again: the second tick was left out, want the backoff started over (one tick)")
	}
}

// TestYieldNeverDefersARunBeyondYieldMax: however slow claims stay, a run
// is left out for at most YieldMax (plus a tick): recovery must still run.
func TestYieldNeverDefersARunBeyondYieldMax(t *testing.T) {
	t.Parallel()
	const period, yieldMax = 2 * time.Minute, 10 * time.Minute
	j, err := New(Config{Name: "recovery", Schedule: "*/2 * * * *", Run: func(context.Context) (bool, error) { return false, nil },
		Yield: func() bool { return true }, YieldMax: yieldMax, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	j.now = func() time.Time { return now }
	var runs []time.Time
	for range 24 * 60 / 2 { // a day of ticks with claims slow throughout
		now = now.Add(period)
		if tickWakes(j) {
			runs = append(runs, now)
		}
	}
	if len(runs) < 2 {
		t.Fatalf("%d runs in a day of slow claims, want a run at least every %s", len(runs), yieldMax+period)
	}
	for i := 1; i < len(runs); i++ {
		if d := runs[i].Sub(runs[i-1]); d > yieldMax+2*period {
			t.Errorf("runs at %s and %s: %s apart, want at most YieldMax (%s) + two periods", runs[i-1].Format(time.TimeOnly), runs[i].Format(time.TimeOnly), d, yieldMax)
		}
	}
	// With 16 ticks (32 minutes) allowed by the gap, YieldMax is what
	// bounds it: runs settle at six ticks apart (five left out, ten minutes).
	if d := runs[len(runs)-1].Sub(runs[len(runs)-2]); d != yieldMax+period {
		t.Errorf("runs settle %s apart, want YieldMax + one period (%s): the tick at YieldMax after the first left out runs", d, yieldMax+period)
	}
}

// onceAt is a schedule with a single tick, at its time.
type onceAt time.Time

func (o onceAt) Next(t time.Time) time.Time {
	if t.Before(time.Time(o)) {
		return time.Time(o)
	}
	return time.Time{}
}

// TestTickDuringRunRunsAfterIt checks that a tick which falls while a run
// is in flight, when nothing waits on the timer, still asks for one more
// run once the run is over, as a Trigger during a run does.
func TestTickDuringRunRunsAfterIt(t *testing.T) {
	t.Parallel()
	tick := time.Now().Add(50 * time.Millisecond)
	ran := make(chan struct{}, 2)
	runs := 0
	j, err := New(Config{Name: "test", Schedule: "@every 1h", Run: func(context.Context) (bool, error) {
		runs++
		if runs == 1 {
			// The run outlasts the schedule's only tick.
			time.Sleep(time.Until(tick) + 10*time.Millisecond)
		}
		ran <- struct{}{}
		return false, nil
	}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	j.schedule = onceAt(tick)
	if err := j.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	j.Trigger()
	for n := 1; n <= 2; n++ {
		select {
		case <-ran:
		case <-time.After(10 * time.Second):
			t.Fatalf("run %d never came; the tick during the first run was lost", n)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := j.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
}

// TestTicksCollapse checks the timing of ticks: ticks missed while a run
// was in flight count once, the next is a whole delay after the moment
// they were noticed, and a schedule without a next tick never fires.
func TestTicksCollapse(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	every, err := parse("@every 100ms")
	if err != nil {
		t.Fatal(err)
	}
	tk := newTicks(every, t0)
	if tk.passed(t0.Add(50 * time.Millisecond)) {
		t.Error("passed before the first tick")
	}
	late := t0.Add(time.Second) // ten ticks' time, spent in a run
	if !tk.passed(late) {
		t.Fatal("not passed a second after a 100ms schedule started")
	}
	if tk.passed(late.Add(50 * time.Millisecond)) {
		t.Error("the ticks missed during a run counted more than once")
	}
	if want := late.Add(100 * time.Millisecond); !tk.next.Equal(want) {
		t.Errorf("next tick = %s, want %s", tk.next, want)
	}
	tk.stop()

	never := newTicks(onceAt(t0), t0.Add(time.Hour))
	if c := never.wait(t0.Add(time.Hour)); c != nil {
		t.Error("wait on a schedule without a next tick returned a channel")
	}
	if never.passed(t0.Add(48 * time.Hour)) {
		t.Error("a schedule without a next tick passed")
	}
}

// TestTicksReadCronInUTC checks that cron fields are read in UTC whatever
// the zone of the time the ticks start from.
func TestTicksReadCronInUTC(t *testing.T) {
	t.Parallel()
	daily, err := parse("0 3 * * *")
	if err != nil {
		t.Fatal(err)
	}
	tokyo := time.FixedZone("UTC+9", 9*3600)
	start := time.Date(2026, 1, 1, 10, 0, 0, 0, tokyo) // 01:00 UTC
	if got, want := newTicks(daily, start).next, time.Date(2026, 1, 1, 3, 0, 0, 0, time.UTC); !got.Equal(want) {
		t.Errorf("next tick of 0 3 * * * from %s = %s, want %s", start, got, want)
	}
}

// woke reports whether the job has been woken to run, taking the wake-up.
func woke(j *Job) bool {
	select {
	case <-j.wake:
		return true
	default:
		return false
	}
}

// tickWakes ticks j at its clock's now and reports whether the tick woke
// it to run.
func tickWakes(j *Job) bool {
	j.tick()
	return woke(j)
}

// TestIdleTicksGrowSparse drives an idle job's ticks by hand: while its
// runs find nothing, runs come 1, 2, 4, 8 ... ticks apart up to IdleMax;
// a Trigger runs at once, and a run that finds work brings the schedule
// back at the next tick.
func TestIdleTicksGrowSparse(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var idleSince time.Time
	j, err := New(Config{Name: "test", Schedule: "@every 1s", IdleMax: 10 * time.Second,
		IdleSince: func() time.Time { return idleSince },
		Run: func(context.Context) (bool, error) {
			if idleSince.IsZero() {
				idleSince = now
			}
			return false, nil
		}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	j.now = func() time.Time { return now }
	j.runOnce(t.Context()) // the first run finds nothing: idle from now
	// ran lists the seconds of 40 ticks at which the job ran.
	ran := func(ticks int) []int {
		var at []int
		for s := 1; s <= ticks; s++ {
			now = now.Add(time.Second)
			if tickWakes(j) {
				j.runOnce(t.Context())
				at = append(at, s)
			}
		}
		return at
	}
	if diff := cmp.Diff([]int{1, 2, 4, 8, 16, 26, 36}, ran(40)); diff != "" {
		t.Errorf("idle runs at seconds (-want +got):\n%s", diff)
	}
	j.Trigger()
	if !woke(j) {
		t.Error("Trigger on an idle job did not wake it")
	}
	idleSince = time.Time{} // a run found work
	if diff := cmp.Diff([]int{1, 2, 3}, ran(3)); diff != "" {
		t.Errorf("runs once work was found (-want +got):\n%s", diff)
	}
}
