package schedule_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/schedule"
)

// idle is a schedule that never ticks during a test: every run is a Trigger.
const idle = "@every 1h"

// wait bounds every wait for the loop; a correct loop answers in microseconds.
const wait = 10 * time.Second

func newJob(t *testing.T, run schedule.Func) *schedule.Job {
	t.Helper()
	j, err := schedule.New(schedule.Config{Name: "test", Schedule: idle, Run: run, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		_ = j.Stop(ctx)
	})
	return j
}

// signalingJob returns a job each of whose runs signals on ran, then
// returns err.
func signalingJob(t *testing.T, err error) (j *schedule.Job, ran <-chan struct{}) {
	t.Helper()
	signal := make(chan struct{}, 1)
	j = newJob(t, func(context.Context) (bool, error) {
		signal <- struct{}{}
		return false, err
	})
	return j, signal
}

func start(t *testing.T, j *schedule.Job) {
	t.Helper()
	if err := j.Start(t.Context()); err != nil {
		t.Fatalf("Start: %v", err)
	}
}

func stop(t *testing.T, j *schedule.Job) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	if err := j.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
}

func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(wait):
		t.Fatalf("timed out after %s waiting for %s", wait, what)
		panic("unreachable")
	}
}

func TestTriggerRuns(t *testing.T) {
	t.Parallel()
	j, ran := signalingJob(t, nil)
	if !j.LastRun().IsZero() {
		t.Errorf("LastRun before any run = %s, want zero", j.LastRun())
	}
	before := time.Now()
	start(t, j)
	j.Trigger()
	receive(t, ran, "the triggered run")
	stop(t, j) // the run has finished once Stop returns
	if last := j.LastRun(); last.Before(before) || last.After(time.Now()) {
		t.Errorf("LastRun = %s, want between %s and now", last, before)
	}
}

func TestMoreDrainsUntilFalse(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	drained := make(chan struct{})
	j := newJob(t, func(context.Context) (bool, error) {
		n := runs.Add(1)
		if n == 5 {
			close(drained)
		}
		return n < 5, nil // four full batches, then a short one
	})
	start(t, j)
	j.Trigger()
	receive(t, drained, "the fifth run")
	stop(t, j)
	if got := runs.Load(); got != 5 {
		t.Errorf("one trigger with more=true four times ran %d times, want 5", got)
	}
}

func TestErrorDoesNotStopLoop(t *testing.T) {
	t.Parallel()
	j, ran := signalingJob(t, errors.New("database down"))
	start(t, j)
	j.Trigger()
	receive(t, ran, "the first run")
	j.Trigger()
	receive(t, ran, "the run after a failed one")
}

func TestRunsNeverOverlap(t *testing.T) {
	t.Parallel()
	var active, maxActive, runs atomic.Int32
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	second := make(chan struct{})
	j := newJob(t, func(context.Context) (bool, error) {
		n := active.Add(1)
		defer active.Add(-1)
		for {
			m := maxActive.Load()
			if n <= m || maxActive.CompareAndSwap(m, n) {
				break
			}
		}
		switch runs.Add(1) {
		case 1:
			started <- struct{}{}
			<-release // hold the first run while triggers pile up
		case 2:
			close(second)
		}
		return false, nil
	})
	start(t, j)
	j.Trigger()
	receive(t, started, "the first run")

	var wg sync.WaitGroup
	for range 20 {
		wg.Go(j.Trigger)
	}
	wg.Wait()
	close(release)
	receive(t, second, "the run the triggers asked for")
	stop(t, j)

	if got := maxActive.Load(); got != 1 {
		t.Errorf("%d runs were in flight at once, want 1", got)
	}
	if got := runs.Load(); got != 2 {
		t.Errorf("20 triggers during one run gave %d runs in all, want 2 (triggers collapse into one)", got)
	}
}

func TestStopWaitsForRunInFlight(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	release := make(chan struct{})
	var finished, cancelled atomic.Bool
	j := newJob(t, func(ctx context.Context) (bool, error) {
		close(started)
		<-release
		cancelled.Store(ctx.Err() != nil)
		finished.Store(true)
		return true, nil // more: Stop must still end the drain
	})
	start(t, j)
	j.Trigger()
	receive(t, started, "the run")

	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		stopped <- j.Stop(ctx)
	}()
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned %v while a run was in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := receive(t, stopped, "Stop"); err != nil {
		t.Errorf("Stop = %v, want nil", err)
	}
	if !finished.Load() {
		t.Error("Stop returned before the run finished")
	}
	if cancelled.Load() {
		t.Error("the run's context was cancelled; Stop within its deadline must let it finish")
	}
}

func TestStopDeadlineCancelsRun(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	var runErr atomic.Value
	var returned atomic.Bool
	j := newJob(t, func(ctx context.Context) (bool, error) {
		close(started)
		<-ctx.Done() // a run that only ends when cancelled
		runErr.Store(ctx.Err())
		returned.Store(true)
		return false, ctx.Err()
	})
	start(t, j)
	j.Trigger()
	receive(t, started, "the run")

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	err := j.Stop(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Stop = %v, want %v", err, context.DeadlineExceeded)
	}
	if !returned.Load() {
		t.Error("Stop returned before the cancelled run returned")
	}
	if got, _ := runErr.Load().(error); !errors.Is(got, context.Canceled) {
		t.Errorf("the run's ctx.Err() = %v, want %v", got, context.Canceled)
	}
}

// A job whose runs only read (CancelOnStop) has nothing to finish: Stop
// cancels its run in flight at once and returns nil, long before its
// deadline, instead of holding the worker's shutdown up to it.
func TestStopCancelsReadOnlyRun(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	j, err := schedule.New(schedule.Config{Name: "reader", Schedule: idle, CancelOnStop: true, Logger: slog.New(slog.DiscardHandler),
		Run: func(ctx context.Context) (bool, error) {
			close(started)
			<-ctx.Done() // a read the server answers only after the stop
			return false, ctx.Err()
		}})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	start(t, j)
	j.Trigger()
	receive(t, started, "the run")
	stopped := make(chan error, 1)
	go func() { stopped <- j.Stop(context.Background()) }() // no deadline: only the cancel ends the run
	if err := receive(t, stopped, "Stop of a job that cancels its run"); err != nil {
		t.Errorf("Stop = %v, want nil", err)
	}
}

func TestStartContextDoesNotCancelRuns(t *testing.T) {
	t.Parallel()
	errs := make(chan error, 1)
	j := newJob(t, func(ctx context.Context) (bool, error) {
		errs <- ctx.Err()
		return false, nil
	})
	ctx, cancel := context.WithCancel(t.Context())
	if err := j.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	cancel()
	j.Trigger()
	if err := receive(t, errs, "the run"); err != nil {
		t.Errorf("run ctx.Err() = %v after Start's ctx was cancelled, want nil: only Stop ends runs", err)
	}
}

func TestStopBeforeStartAndTwice(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	j := newJob(t, func(context.Context) (bool, error) {
		runs.Add(1)
		return false, nil
	})
	stop(t, j)
	stop(t, j)
	// A Start after Stop must not bring the job back to life.
	start(t, j)
	j.Trigger()
	stop(t, j)
	if got := runs.Load(); got != 0 {
		t.Errorf("a job stopped before Start ran %d times, want 0", got)
	}
}

func TestStopTwiceAfterStart(t *testing.T) {
	t.Parallel()
	j, ran := signalingJob(t, nil)
	start(t, j)
	j.Trigger()
	receive(t, ran, "the run")
	stop(t, j)
	stop(t, j)
}

func TestPanicDoesNotKillLoop(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	ran := make(chan int32, 2)
	j := newJob(t, func(context.Context) (bool, error) {
		n := runs.Add(1)
		ran <- n
		if n == 1 {
			panic("bug in a run")
		}
		return false, nil
	})
	start(t, j)
	j.Trigger()
	receive(t, ran, "the panicking run")
	j.Trigger()
	if n := receive(t, ran, "the run after the panic"); n != 2 {
		t.Errorf("run after the panic is run %d, want 2", n)
	}
	stop(t, j)
	if j.LastRun().IsZero() {
		t.Error("LastRun is zero after two runs")
	}
}

// TestRunsWithoutTrigger checks the runs that come without a Trigger: the
// schedule's ticks, and the run at start that RunAtStart asks for.
func TestRunsWithoutTrigger(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, schedule string
		runAtStart     bool
		want           string
	}{
		{"tick", "@every 1s", false, "a run from the schedule, without Trigger"},
		{"run at start", idle, true, "the run at start, without Trigger or tick"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ran := make(chan struct{}, 1)
			j, err := schedule.New(schedule.Config{Name: tt.name, Schedule: tt.schedule, RunAtStart: tt.runAtStart,
				Run: func(context.Context) (bool, error) {
					select {
					case ran <- struct{}{}:
					default:
					}
					return false, nil
				}, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			start(t, j)
			receive(t, ran, tt.want)
			stop(t, j)
		})
	}
}

func TestParse(t *testing.T) {
	t.Parallel()
	for _, spec := range []string{"@every 1s", "@every 100ms", "*/2 * * * *", "@hourly", "0 3 * * 1-5"} {
		if _, err := schedule.Parse(spec); err != nil {
			t.Errorf("Parse(%q) = %v, want nil", spec, err)
		}
	}
	for _, spec := range []string{"bogus", "", "* * *", "61 * * * *"} {
		_, err := schedule.Parse(spec)
		if err == nil {
			t.Errorf("Parse(%q) = nil, want an error", spec)
			continue
		}
		if want := `"` + spec + `"`; !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %q, want the spec %s named", spec, err, want)
		}
	}
}

func TestNewRejectsBadSpec(t *testing.T) {
	t.Parallel()
	_, err := schedule.New(schedule.Config{Name: "claim", Schedule: "bogus", Run: func(context.Context) (bool, error) { return false, nil }})
	if err == nil || !strings.Contains(err.Error(), `"bogus"`) {
		t.Errorf(`New with spec "bogus" = %v, want an error naming "bogus"`, err)
	}
}
