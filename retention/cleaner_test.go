package retention

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/metrics/metricstest"
	"github.com/outboxrelay/outbox/mongo/mongotest"
	"github.com/outboxrelay/outbox/service"
	"github.com/outboxrelay/outbox/service/servicetest"
)

var discard = slog.New(slog.DiscardHandler)

// clock is the cleaner's now in these tests.
var clock = time.Date(2025, 3, 4, 12, 0, 0, 0, time.UTC)

func setup(t *testing.T, cfg Config) (*Cleaner, *driver.Collection, *metrics.Metrics) {
	t.Helper()
	store := mongotest.Store(t)
	now := cfg.Now
	if now == nil {
		now = func() time.Time { return clock }
	}
	cfg.Archetype = servicetest.Archetype(now)
	c, err := New(store, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	c.now = func() time.Time { return clock }
	return c, store.Collection(), cfg.Metrics
}

// TestCutoffFromTheDatabaseClock: the cutoff is Config.Now (the
// database's time) less the retention, whatever this machine's clock says.
func TestCutoffFromTheDatabaseClock(t *testing.T) {
	t.Parallel()
	const retention = 7 * 24 * time.Hour
	for _, tt := range []struct {
		name    string
		dbClock time.Time // Config.Now; the local clock is clock
		want    []string  // the events left
	}{
		{"database clock behind the replica's", clock.Add(-2 * time.Hour), []string{"1h-over-locally", "young"}},
		{"database clock ahead of the replica's", clock.Add(2 * time.Hour), []string{"young"}},
		{"clocks agree", clock, []string{"young"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			db := tt.dbClock
			c, coll, _ := setup(t, Config{Retention: retention, Archetype: service.Archetype{Now: func() time.Time { return db }}})
			mongotest.Insert(t, coll,
				event("3h-over", events.StatusPublished, publishedAt(clock.Add(-retention-3*time.Hour))),
				event("1h-over-locally", events.StatusPublished, publishedAt(clock.Add(-retention-time.Hour))),
				event("young", events.StatusPublished, publishedAt(clock.Add(-retention+3*time.Hour))),
			)
			drain(t, c)
			var left []string
			for id := range mongotest.Statuses(t, coll) {
				left = append(left, id)
			}
			slices.Sort(left)
			if diff := cmp.Diff(tt.want, left); diff != "" {
				t.Errorf("events left (-want +got):\n%s", diff)
			}
		})
	}
}

// event returns an event document created long before any cutoff.
func event(id string, status events.Status, extra ...bson.E) bson.D {
	return mongotest.Event(id, status, clock.Add(-30*24*time.Hour), extra...)
}

func publishedAt(at time.Time) bson.E { return bson.E{Key: events.FieldPublishedAt, Value: at} }

func count(t *testing.T, coll *driver.Collection, filter bson.D) int64 {
	t.Helper()
	n, err := coll.CountDocuments(t.Context(), filter)
	if err != nil {
		t.Fatalf("count: %v", err)
	}
	return n
}

// drain calls runOnce as the schedule does: again at once while it
// reports more. It returns how many calls one run took.
func drain(t *testing.T, c *Cleaner) int {
	t.Helper()
	for calls := 1; ; calls++ {
		more, err := c.runOnce(t.Context())
		if err != nil {
			t.Fatalf("runOnce call %d: %v", calls, err)
		}
		if !more {
			return calls
		}
		if calls > 100 {
			t.Fatal("runOnce reports more after 100 batches")
		}
	}
}

// pauses records the cleaner's pauses instead of sleeping.
func pauses(c *Cleaner) *[]time.Duration {
	var got []time.Duration
	c.pause = func(_ context.Context, d time.Duration) bool {
		got = append(got, d)
		return true
	}
	return &got
}

func TestRunOnceDeletesOldPublishedWhileBatchesComeBackFull(t *testing.T) {
	t.Parallel()
	const batch = 3
	c, coll, m := setup(t, Config{Retention: 24 * time.Hour, BatchSize: batch})
	paused := pauses(c)
	cutoff := clock.Add(-24 * time.Hour)
	// More old events than the old limit of 10 batches per run.
	const old = 12*batch + 1
	var docs []bson.D
	for i := range old {
		docs = append(docs, event(fmt.Sprintf("old-%02d", i), events.StatusPublished, publishedAt(cutoff.Add(-time.Duration(i+1)*time.Minute))))
	}
	docs = append(docs,
		event("young", events.StatusPublished, publishedAt(cutoff.Add(time.Minute))),
		event("failed", events.StatusFailed, bson.E{Key: events.FieldFailedAt, Value: cutoff.Add(-time.Hour)}),
		event("new", events.StatusNew),
	)
	mongotest.Insert(t, coll, docs...)

	// One run: 12 full batches, then the partial one that ends it.
	if calls := drain(t, c); calls != 13 {
		t.Errorf("the run took %d batches, want 13 (12 full, 1 partial)", calls)
	}
	if len(*paused) != 12 {
		t.Errorf("paused %d times, want 12 (before every batch but the first)", len(*paused))
	}
	metricstest.Want(t, "deleted metric", m.Deleted, float64(old))
	remaining := map[string]int64{
		"PUBLISHED": count(t, coll, bson.D{{Key: events.FieldStatus, Value: events.StatusPublished}}),
		"FAILED":    count(t, coll, bson.D{{Key: events.FieldStatus, Value: events.StatusFailed}}),
		"NEW":       count(t, coll, bson.D{{Key: events.FieldStatus, Value: events.StatusNew}}),
		"young":     count(t, coll, bson.D{{Key: events.FieldID, Value: "young"}}),
	}
	if diff := cmp.Diff(map[string]int64{"PUBLISHED": 1, "FAILED": 1, "NEW": 1, "young": 1}, remaining); diff != "" {
		t.Errorf("events left (-want +got):\n%s", diff)
	}
	// Nothing left to delete: the next run is one empty batch, no pause.
	if calls := drain(t, c); calls != 1 || len(*paused) != 12 {
		t.Errorf("a run with nothing to delete took %d batches and %d pauses, want 1 and 12", calls, len(*paused))
	}
}

// slowStore always deletes a full batch, and each delete moves the
// cleaner's clock on by took.
type slowStore struct {
	now   *time.Time
	took  time.Duration
	calls int
}

func (s *slowStore) DeletePublished(_ context.Context, _ time.Time, limit int) (int, error) {
	s.calls++
	*s.now = s.now.Add(s.took)
	return limit, nil
}

func TestRunOnceIsBoundedByTimeAndPausesAsLongAsTheLastBatch(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name        string
		took, limit time.Duration
		wantPauses  []time.Duration
	}{
		// Batches end at 8 s, 16 s and 24 s of the run: the third is past 20 s.
		{"bounded by time", 8 * time.Second, 20 * time.Second, []time.Duration{8 * time.Second, 8 * time.Second}},
		// A very slow delete does not stall the run for as long.
		{"pause capped", time.Hour, 3 * time.Hour, []time.Duration{maxPause, maxPause}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			now := clock
			store := &slowStore{now: &now, took: tt.took}
			c, err := New(store, Config{Retention: time.Hour, BatchSize: 5, MaxRunTime: tt.limit, Archetype: service.Archetype{Logger: discard}})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			c.now = func() time.Time { return now }
			paused := pauses(c)
			if calls := drain(t, c); calls != 3 {
				t.Errorf("the run took %d batches, want 3", calls)
			}
			if diff := cmp.Diff(tt.wantPauses, *paused); diff != "" {
				t.Errorf("pauses (-want +got):\n%s", diff)
			}
			// The next run starts afresh: no pause before its first batch.
			if more, err := c.runOnce(t.Context()); !more || err != nil || len(*paused) != 2 {
				t.Errorf("next run's first batch = %t, %v after %d pauses; want true, nil after 2", more, err, len(*paused))
			}
		})
	}
}

func TestStopEndsTheRunDuringAPause(t *testing.T) {
	t.Parallel()
	now := clock
	store := &slowStore{now: &now, took: time.Second}
	c, err := New(store, Config{Retention: time.Hour, BatchSize: 5, Archetype: service.Archetype{Logger: discard}})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	c.now = func() time.Time { return now }
	if more, err := c.runOnce(t.Context()); !more || err != nil {
		t.Fatalf("first batch = %t, %v; want true, nil", more, err)
	}
	if err := c.Stop(t.Context()); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	// The real pause: it must return at once, the cleaner being stopped.
	if more, err := c.runOnce(t.Context()); more || err != nil || store.calls != 1 {
		t.Errorf("after Stop: runOnce = %t, %v with %d deletes; want false, nil with 1", more, err, store.calls)
	}
}

// failingStore is a retention.Store that deletes one batch and then loses
// its database.
type failingStore struct{ calls int }

func (s *failingStore) DeletePublished(_ context.Context, _ time.Time, limit int) (int, error) {
	s.calls++
	if s.calls == 1 {
		return limit, nil
	}
	return 0, errors.New("connection reset")
}

func TestRunOnceCountsWhatItDeletedBeforeAnError(t *testing.T) {
	t.Parallel()
	m := metrics.New(nil)
	c, err := New(&failingStore{}, Config{Retention: time.Hour, BatchSize: 5, Archetype: service.Archetype{Logger: discard, Metrics: m}})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if more, err := c.runOnce(t.Context()); !more || err != nil {
		t.Fatalf("first batch = %t, %v; want true, nil", more, err)
	}
	c.pause = func(context.Context, time.Duration) bool { return true }
	if _, err := c.runOnce(t.Context()); err == nil || !strings.Contains(err.Error(), "connection reset") {
		t.Errorf("runOnce = %v, want the store's error wrapped", err)
	}
	metricstest.Want(t, "deleted (the batch before the error)", m.Deleted, 5)
	metricstest.Want(t, "job_errors{job=retention}", m.JobErrors.WithLabelValues("retention"), 1)
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	testenv.WantRefused(t, func(c Config) error { _, err := New(&failingStore{}, c); return err }, map[string]Config{
		"Retention -1h0m0s": {Retention: -time.Hour},
		"BatchSize -1":      {Retention: time.Hour, BatchSize: -1},
		`"bogus"`:           {Retention: time.Hour, Schedule: "bogus"},
		"MaxRunTime -1s":    {Retention: time.Hour, MaxRunTime: -time.Second},
	})
	c, err := New(&failingStore{}, Config{})
	if err != nil {
		t.Fatalf("New with defaults: %v", err)
	}
	if c.cfg.BatchSize != BatchSizeDefault || c.cfg.Schedule != ScheduleDefault || c.cfg.MaxRunTime != MaxRunTimeDefault {
		t.Errorf("defaults: batch size %d, schedule %q, max run time %s; want %d, %q, %s",
			c.cfg.BatchSize, c.cfg.Schedule, c.cfg.MaxRunTime, BatchSizeDefault, ScheduleDefault, MaxRunTimeDefault)
	}
}

// TestBatchesCarryAServerSideTimeLimit: a batch's find and delete carry
// maxTimeMS within the batch's own timeout.
func TestBatchesCarryAServerSideTimeLimit(t *testing.T) {
	t.Parallel()
	store, rec := mongotest.RecordingStore(t)
	mongotest.Insert(t, store.Collection(), event("old", events.StatusPublished, publishedAt(clock.Add(-8*24*time.Hour))))
	rec.Take()
	c, err := New(store, Config{Retention: 7 * 24 * time.Hour, Archetype: service.Archetype{Logger: discard}})
	if err != nil {
		t.Fatal(err)
	}
	c.now = func() time.Time { return clock }
	drain(t, c)
	seen := map[string]bool{}
	for _, sent := range rec.Take() {
		if sent.Name != "find" && sent.Name != "delete" {
			continue
		}
		seen[sent.Name] = true
		v, err := sent.Command.LookupErr("maxTimeMS")
		ms, ok := v.AsInt64OK()
		if err != nil || !ok || ms <= 0 || ms > batchTimeout.Milliseconds() {
			t.Errorf("retention sent %s with maxTimeMS %v, want 1 to %d ms", sent.Name, v, batchTimeout.Milliseconds())
		}
	}
	if !seen["find"] || !seen["delete"] {
		t.Errorf("retention sent %v, want a find and a delete", seen)
	}
}

// TestRunEndsWhileClaimsAreSlow: a run that drains full batches ends after
// its current batch once claims are slow, and the next run starts afresh.
func TestRunEndsWhileClaimsAreSlow(t *testing.T) {
	t.Parallel()
	var slow bool
	c, coll, _ := setup(t, Config{Retention: time.Hour, BatchSize: 2, Yield: func() bool { return slow }})
	pauses(c)
	var docs []bson.D
	for i := range 6 {
		docs = append(docs, event(fmt.Sprintf("p%d", i), events.StatusPublished, publishedAt(clock.Add(-2*time.Hour))))
	}
	mongotest.Insert(t, coll, docs...)
	published := bson.D{{Key: events.FieldStatus, Value: events.StatusPublished}}

	more, err := c.runOnce(t.Context())
	if err != nil || !more {
		t.Fatalf("first batch: more %t, %v; want more (a full batch)", more, err)
	}
	slow = true
	if more, err := c.runOnce(t.Context()); err != nil || more {
		t.Fatalf("next batch with claims slow: more %t, %v; want the run ended", more, err)
	}
	if n := count(t, coll, published); n != 4 {
		t.Errorf("%d PUBLISHED events left, want 4: the run ended before its second batch", n)
	}
	slow = false
	if calls := drain(t, c); calls != 3 {
		t.Errorf("the next run took %d calls, want 3 (two full batches and an empty one)", calls)
	}
	if n := count(t, coll, published); n != 0 {
		t.Errorf("%d PUBLISHED events left after the next run, want 0", n)
	}
}
