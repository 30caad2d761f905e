package recovery

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/fakeclock"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/metrics/metricstest"
	"github.com/outboxrelay/outbox/mongo/mongotest"
	"github.com/outboxrelay/outbox/service"
	"github.com/outboxrelay/outbox/service/servicetest"
)

var discard = slog.New(slog.DiscardHandler)

// clock is the recoverer's now in these tests, a whole millisecond as BSON
// dates keep.
var clock = time.Date(2025, 3, 4, 12, 0, 0, 0, time.UTC)

func setup(t *testing.T, cfg Config) (*Recoverer, *driver.Collection, *metrics.Metrics) {
	t.Helper()
	store := mongotest.Store(t)
	cfg.Archetype = servicetest.Archetype(func() time.Time { return clock })
	r, err := New(store, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return r, store.Collection(), cfg.Metrics
}

// processing returns a PROCESSING event claimed at claimedAt.
func processing(id string, claimedAt time.Time, attempts int) bson.D {
	return mongotest.Event(id, events.StatusProcessing, clock.Add(-time.Hour),
		bson.E{Key: events.FieldWorkerID, Value: "dead-worker"},
		bson.E{Key: events.FieldClaimToken, Value: "token"},
		bson.E{Key: events.FieldProcessingAt, Value: claimedAt},
		bson.E{Key: events.FieldAttempts, Value: attempts},
	)
}

func TestRunOnceResetsStaleClaims(t *testing.T) {
	t.Parallel()
	var resets int
	r, coll, m := setup(t, Config{StaleAfter: time.Minute, MaxAttempts: 5, OnReset: func() { resets++ }})
	mongotest.Insert(t, coll,
		processing("stale-1", clock.Add(-61*time.Second), 1),
		processing("stale-2", clock.Add(-time.Hour), 4),
		processing("stale-last", clock.Add(-2*time.Minute), 5),
		processing("fresh", clock.Add(-59*time.Second), 5),
	)

	more, err := r.runOnce(t.Context())
	if more || err != nil {
		t.Fatalf("runOnce = %t, %v; want false, nil", more, err)
	}
	want := map[string]events.Status{
		"stale-1": events.StatusNew, "stale-2": events.StatusNew,
		"stale-last": events.StatusFailed, "fresh": events.StatusProcessing,
	}
	if diff := cmp.Diff(want, mongotest.Statuses(t, coll)); diff != "" {
		t.Errorf("statuses after recovery (-want +got):\n%s", diff)
	}
	metricstest.Want(t, "recovered", m.Recovered, 2)
	metricstest.Want(t, "failed{reason=stale_max_attempts}", m.Failed.WithLabelValues(metrics.ReasonStaleMaxAttempts), 1)

	// A second run, as another replica's, finds nothing more to do.
	if _, err := r.runOnce(t.Context()); err != nil {
		t.Fatalf("second runOnce: %v", err)
	}
	metricstest.Want(t, "recovered after a second run", m.Recovered, 2)
	metricstest.Want(t, "job errors", m.JobErrors.WithLabelValues("recovery"), 0)
	// The run that put events back to NEW asked for a claim; the one that
	// found nothing did not.
	if resets != 1 {
		t.Errorf("OnReset called %d times over a run that reset events and one that did not, want once", resets)
	}
}

// A PROCESSING event whose processingAt could never go stale is reset on
// the recoverer's first run, as the database's clock tells: far ahead of
// clock counts, a little ahead (skew) waits for the stale test.
func TestRunOnceResetsUnusableProcessingAt(t *testing.T) {
	t.Parallel()
	r, coll, m := setup(t, Config{StaleAfter: time.Minute, MaxAttempts: 5})
	noClaimTime := processing("no-processing-at", clock, 1)[:4] // _id, type, payload, status
	noClaimTime = append(noClaimTime, bson.E{Key: events.FieldCreatedAt, Value: clock.Add(-time.Hour)})
	mongotest.Insert(t, coll,
		noClaimTime,
		processing("text", clock, 1),
		processing("next-year", clock.AddDate(1, 0, 0), 1),
		processing("skewed", clock.Add(30*time.Second), 1),
	)
	if _, err := coll.UpdateOne(t.Context(), bson.D{{Key: "_id", Value: "text"}},
		bson.D{{Key: "$set", Value: bson.D{{Key: events.FieldProcessingAt, Value: "now"}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.runOnce(t.Context()); err != nil {
		t.Fatalf("runOnce: %v", err)
	}
	want := map[string]events.Status{
		"no-processing-at": events.StatusNew, "text": events.StatusNew, "next-year": events.StatusNew,
		"skewed": events.StatusProcessing,
	}
	if diff := cmp.Diff(want, mongotest.Statuses(t, coll)); diff != "" {
		t.Errorf("statuses after recovery (-want +got):\n%s", diff)
	}
	metricstest.Want(t, "recovered", m.Recovered, 3)
}

// MaxAttempts 0 means the claimer's default, not unlimited: a stale event
// that has used its claims becomes FAILED, and one claim short goes back.
func TestRunOnceDefaultAttemptLimit(t *testing.T) {
	t.Parallel()
	r, coll, m := setup(t, Config{StaleAfter: time.Minute})
	mongotest.Insert(t, coll,
		processing("one-left", clock.Add(-time.Hour), events.MaxAttemptsDefault-1),
		processing("used-up", clock.Add(-time.Hour), events.MaxAttemptsDefault),
		processing("over", clock.Add(-time.Hour), 100),
	)
	if _, err := r.runOnce(t.Context()); err != nil {
		t.Fatalf("runOnce: %v", err)
	}
	want := map[string]events.Status{"one-left": events.StatusNew, "used-up": events.StatusFailed, "over": events.StatusFailed}
	if diff := cmp.Diff(want, mongotest.Statuses(t, coll)); diff != "" {
		t.Errorf("MaxAttempts 0 means %d (-want +got):\n%s", events.MaxAttemptsDefault, diff)
	}
	metricstest.Want(t, "recovered", m.Recovered, 1)
}

// failingStore is a recovery.Store whose database is down.
type failingStore struct{}

func (failingStore) RecoverStale(context.Context, time.Time, time.Time, int) (int, int, error) {
	return 0, 0, errors.New("server selection timeout")
}

func TestRunOnceCountsErrors(t *testing.T) {
	t.Parallel()
	m := metrics.New(nil)
	r, err := New(failingStore{}, Config{Archetype: service.Archetype{Logger: discard, Metrics: m}})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if _, err := r.runOnce(t.Context()); err == nil || !strings.Contains(err.Error(), "server selection timeout") {
		t.Errorf("runOnce on a failing store = %v, want the store's error wrapped", err)
	}
	metricstest.Want(t, "job_errors{job=recovery}", m.JobErrors.WithLabelValues("recovery"), 1)
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	testenv.WantRefused(t, func(c Config) error { _, err := New(failingStore{}, c); return err }, map[string]Config{
		"recovery: StaleAfter -1s":   {StaleAfter: -time.Second},
		"recovery: MaxAttempts -1":   {MaxAttempts: -1},
		`recovery: Schedule "bogus"`: {Schedule: "bogus"},
	})
	r, err := New(failingStore{}, Config{})
	if err != nil {
		t.Fatalf("New with defaults: %v", err)
	}
	if r.cfg.StaleAfter != StaleAfterDefault || r.cfg.Schedule != ScheduleDefault || r.cfg.MaxAttempts != events.MaxAttemptsDefault {
		t.Errorf("defaults: stale after %s, schedule %q, max attempts %d; want %s, %q, %d",
			r.cfg.StaleAfter, r.cfg.Schedule, r.cfg.MaxAttempts, StaleAfterDefault, ScheduleDefault, events.MaxAttemptsDefault)
	}
}

// TestRunsCarryAServerSideTimeLimit: recovery's writes carry maxTimeMS,
// within its run's own timeout, whatever deadline the schedule gives.
func TestRunsCarryAServerSideTimeLimit(t *testing.T) {
	t.Parallel()
	store, rec := mongotest.RecordingStore(t)
	mongotest.Insert(t, store.Collection(), processing("stale", clock.Add(-time.Hour), 5), processing("stale-2", clock.Add(-time.Hour), 1))
	rec.Take()
	r, err := New(store, Config{StaleAfter: time.Minute, Archetype: service.Archetype{Logger: discard, Now: func() time.Time { return clock }}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.runOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	sent := map[string]int{}
	for _, c := range rec.Take() {
		if c.Name != "update" && c.Name != "aggregate" {
			continue
		}
		sent[c.Name]++
		v, err := c.Command.LookupErr("maxTimeMS")
		ms, ok := v.AsInt64OK()
		if err != nil || !ok || ms <= 0 || ms > runTimeout.Milliseconds() {
			t.Errorf("recovery sent an %s with maxTimeMS %v, want 1 to %d ms", c.Name, v, runTimeout.Milliseconds())
		}
	}
	// One list of the claims' workers and at least one write for each of
	// fail out of attempts, reset stale, reset unusable processingAt.
	if sent["aggregate"] != 3 || sent["update"] < 3 {
		t.Errorf("recovery sent %d aggregates and %d updates, want 3 and at least 3", sent["aggregate"], sent["update"])
	}
}

// TestYieldsWhileClaimsAreSlow: while claims are slow, scheduled runs are
// left out and counted; a Trigger still runs.
func TestYieldsWhileClaimsAreSlow(t *testing.T) {
	t.Parallel()
	store := &countingStore{}
	m := metrics.New(nil)
	r, err := New(store, Config{Schedule: "@every 10ms", Archetype: service.Archetype{Logger: discard, Metrics: m}, Yield: func() bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(context.WithoutCancel(t.Context())) })
	testenv.Eventually(t, testenv.WaitTimeout, func() (bool, string) {
		return testutil.ToFloat64(m.RunsLeftOut.WithLabelValues("recovery")) >= 10, "ten runs left out"
	})
	left := testutil.ToFloat64(m.RunsLeftOut.WithLabelValues("recovery"))
	if runs := float64(store.runs.Load()); runs >= left {
		t.Errorf("%v runs while %v were left out, want fewer runs (the gap doubles)", runs, left)
	}
	before := store.runs.Load()
	r.Trigger()
	testenv.Eventually(t, testenv.WaitTimeout, func() (bool, string) {
		return store.runs.Load() > before, "a triggered run while yielding"
	})
}

// countingStore counts RecoverStale calls and resets nothing.
type countingStore struct{ runs atomic.Int32 }

func (s *countingStore) RecoverStale(context.Context, time.Time, time.Time, int) (int, int, error) {
	s.runs.Add(1)
	return 0, 0, nil
}

// A jump of the database clock's offset larger than the margin leaves
// recovery's runs out for the stale threshold: a claim 50 s old, healthy
// at a 60 s threshold, looks 70 s old once this replica's view of the
// server's time jumps 20 s ahead (a failover to a node whose clock is
// ahead), and taking it back would publish it twice. A jump within the
// margin leaves the runs as they are; after the threshold they run again.
func TestClockJumpLeavesRunsOut(t *testing.T) {
	t.Parallel()
	store := mongotest.Store(t)
	local := fakeclock.New(clock)
	var jump time.Duration
	m := metrics.New(nil)
	r, err := New(store, Config{StaleAfter: time.Minute, Archetype: service.Archetype{Logger: discard, Metrics: m,
		Now: func() time.Time { return clock.Add(jump) }, Local: local.Now}})
	if err != nil {
		t.Fatal(err)
	}
	mongotest.Insert(t, store.Collection(), processing("healthy", clock.Add(-50*time.Second), 1))
	r.ClockJumped(r.cfg.Margin) // within the margin: nothing changes
	jump = 20 * time.Second
	r.ClockJumped(jump)
	if _, err := r.runOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := mongotest.Statuses(t, store.Collection())["healthy"]; got != events.StatusProcessing {
		t.Errorf("a healthy claim after the clock jumped 20 s ahead: %s, want PROCESSING", got)
	}
	if got := testutil.ToFloat64(m.RunsLeftOut.WithLabelValues("recovery")); got != 1 {
		t.Errorf("runs left out = %v, want 1", got)
	}
	local.Advance(time.Minute)
	jump += time.Minute
	if _, err := r.runOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := mongotest.Statuses(t, store.Collection())["healthy"]; got != events.StatusNew {
		t.Errorf("the claim, stale by any clock a threshold after the jump: %s, want NEW", got)
	}
}
