package retention

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/mongo"
)

var discard = slog.New(slog.DiscardHandler)

// clock is the cleaner's now in these tests.
var clock = time.Date(2025, 3, 4, 12, 0, 0, 0, time.UTC)

func setup(t *testing.T, cfg Config) (*Cleaner, *driver.Collection, *metrics.Metrics) {
	t.Helper()
	db := testenv.Database(t)
	store := mongo.New(db.Client(), mongo.Config{Database: db.Name(), Logger: discard})
	if err := store.Prepare(t.Context()); err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	cfg.Logger = discard
	cfg.Metrics = metrics.New(nil)
	c, err := New(store, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	c.now = func() time.Time { return clock }
	return c, store.Collection(), cfg.Metrics
}

func event(id string, status events.Status, extra ...bson.E) bson.D {
	d := bson.D{
		{Key: events.FieldID, Value: id},
		{Key: events.FieldType, Value: "order.created"},
		{Key: events.FieldPayload, Value: bson.D{{Key: "n", Value: 1}}},
		{Key: events.FieldStatus, Value: status},
		{Key: events.FieldCreatedAt, Value: clock.Add(-30 * 24 * time.Hour)},
	}
	return append(d, extra...)
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

func TestRunOnceDeletesOldPublishedInBoundedBatches(t *testing.T) {
	t.Parallel()
	const batch = 3
	c, coll, m := setup(t, Config{Retention: 24 * time.Hour, BatchSize: batch})
	cutoff := clock.Add(-24 * time.Hour)
	// More old events than one run deletes: 10 batches of 3 per run.
	const old = maxBatchesPerRun*batch + 4
	var docs []any
	for i := range old {
		docs = append(docs, event(fmt.Sprintf("old-%02d", i), events.StatusPublished, publishedAt(cutoff.Add(-time.Duration(i+1)*time.Minute))))
	}
	docs = append(docs,
		event("young", events.StatusPublished, publishedAt(cutoff.Add(time.Minute))),
		event("failed", events.StatusFailed, bson.E{Key: events.FieldFailedAt, Value: cutoff.Add(-time.Hour)}),
		event("new", events.StatusNew),
	)
	if _, err := coll.InsertMany(t.Context(), docs); err != nil {
		t.Fatalf("insert: %v", err)
	}

	var deleted []float64
	for range 3 {
		more, err := c.runOnce(t.Context())
		if more || err != nil {
			t.Fatalf("runOnce = %t, %v; want false, nil (a run is bounded; the next goes on)", more, err)
		}
		deleted = append(deleted, testutil.ToFloat64(m.Deleted))
	}
	if diff := cmp.Diff([]float64{maxBatchesPerRun * batch, old, old}, deleted); diff != "" {
		t.Errorf("deleted metric after each run (-want +got):\n%s", diff)
	}
	remaining := map[string]int64{
		"PUBLISHED": count(t, coll, bson.D{{Key: events.FieldStatus, Value: events.StatusPublished}}),
		"FAILED":    count(t, coll, bson.D{{Key: events.FieldStatus, Value: events.StatusFailed}}),
		"NEW":       count(t, coll, bson.D{{Key: events.FieldStatus, Value: events.StatusNew}}),
		"young":     count(t, coll, bson.D{{Key: events.FieldID, Value: "young"}}),
	}
	if diff := cmp.Diff(map[string]int64{"PUBLISHED": 1, "FAILED": 1, "NEW": 1, "young": 1}, remaining); diff != "" {
		t.Errorf("events left (-want +got):\n%s", diff)
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
	c, err := New(&failingStore{}, Config{Retention: time.Hour, BatchSize: 5, Logger: discard, Metrics: m})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if _, err := c.runOnce(t.Context()); err == nil || !strings.Contains(err.Error(), "connection reset") {
		t.Errorf("runOnce = %v, want the store's error wrapped", err)
	}
	if got := testutil.ToFloat64(m.Deleted); got != 5 {
		t.Errorf("deleted = %v, want 5 (the batch before the error)", got)
	}
	if got := testutil.ToFloat64(m.JobErrors.WithLabelValues("retention")); got != 1 {
		t.Errorf("job_errors{job=retention} = %v, want 1", got)
	}
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		cfg  Config
		want string
	}{
		{Config{Retention: -time.Hour}, "retention -1h0m0s"},
		{Config{Retention: time.Hour, BatchSize: -1}, "batch size -1"},
		{Config{Retention: time.Hour, Schedule: "bogus"}, `"bogus"`},
	} {
		_, err := New(&failingStore{}, tt.cfg)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%+v) = %v, want an error naming %s", tt.cfg, err, tt.want)
		}
	}
	c, err := New(&failingStore{}, Config{})
	if err != nil {
		t.Fatalf("New with defaults: %v", err)
	}
	if c.cfg.BatchSize != BatchSizeDefault || c.cfg.Schedule != ScheduleDefault {
		t.Errorf("defaults: batch size %d, schedule %q; want %d, %q", c.cfg.BatchSize, c.cfg.Schedule, BatchSizeDefault, ScheduleDefault)
	}
}
