package ops_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/ops"
)

// startSampler starts a sampler on spec; with an hourly spec the only
// sample is the one Start takes at once.
func startSampler(t *testing.T, cfg ops.SamplerConfig) {
	t.Helper()
	cfg.StaleAfter, cfg.Logger = time.Minute, discard
	s, err := ops.NewSampler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	startStopped(t, s)
}

func TestSamplerSetsGauges(t *testing.T) {
	t.Parallel()
	m := metrics.New(nil)
	store := &fakeStore{stats: events.Stats{
		Counts:    map[events.Status]int64{events.StatusNew: 7, events.StatusProcessing: 2, events.StatusPublished: 40, events.StatusFailed: 1},
		OldestNew: time.Now().Add(-30 * time.Second),
		Stale:     2,
	}}
	startSampler(t, ops.SamplerConfig{Store: store, Schedule: "@every 1h", Metrics: m})

	// The sampler sets the gauges one after the other: wait for all.
	want := map[string]float64{"NEW": 7, "PROCESSING": 2, "PUBLISHED": 40, "FAILED": 1, "oldest_new_age_over_30s": 1, "stale": 2}
	gauges := func() map[string]float64 {
		got := map[string]float64{}
		for _, status := range []string{"NEW", "PROCESSING", "PUBLISHED", "FAILED"} {
			got[status] = testutil.ToFloat64(m.Events.WithLabelValues(status))
		}
		if age := testutil.ToFloat64(m.OldestNewAge); age >= 30 && age < 40 {
			got["oldest_new_age_over_30s"] = 1
		}
		got["stale"] = testutil.ToFloat64(m.StaleProcessing)
		return got
	}
	testenv.Eventually(t, waitTimeout, func() (bool, string) {
		diff := cmp.Diff(want, gauges())
		return diff == "", "gauges after Start (-want +got):\n" + diff
	})
	if d := time.Since(store.lastStaleBefore()) - time.Minute; d < -5*time.Second || d > 5*time.Second {
		t.Errorf("Stats asked with staleBefore %s, want about now - 1m", store.lastStaleBefore())
	}
}

func TestSamplerSetsHeldGauges(t *testing.T) {
	t.Parallel()
	m := metrics.New(nil)
	store := &fakeStore{stats: events.Stats{Counts: map[events.Status]int64{}},
		held: events.HeldStats{Aggregates: 2, OldestWaiting: time.Now().Add(-time.Hour)}}
	startSampler(t, ops.SamplerConfig{Store: store, Held: store, FailedHolds: true, Schedule: "@every 1h", Metrics: m})
	eventually(t, "held gauges set", func() bool {
		age := testutil.ToFloat64(m.OldestHeldAge)
		return testutil.ToFloat64(m.HeldAggregates) == 2 && age >= 3600 && age < 3610
	})
}

func TestSamplerCountsFailure(t *testing.T) {
	t.Parallel()
	m := metrics.New(nil)
	store := &fakeStore{stats: events.Stats{Counts: map[events.Status]int64{events.StatusNew: 7}}}
	startSampler(t, ops.SamplerConfig{Store: store, Schedule: "@every 10ms", Metrics: m})
	eventually(t, "a good sample sets the NEW gauge", func() bool {
		return testutil.ToFloat64(m.Events.WithLabelValues("NEW")) == 7
	})
	store.setStats(events.Stats{}, errors.New("server selection timeout"))
	eventually(t, "a failed sample counts as a sampler job error", func() bool {
		return testutil.ToFloat64(m.JobErrors.WithLabelValues("sampler")) >= 1
	})
	if got := testutil.ToFloat64(m.Events.WithLabelValues("NEW")); got != 7 {
		t.Errorf("NEW gauge after a failed sample = %v, want 7: a failure must leave the last good sample", got)
	}
}
