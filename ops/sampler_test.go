package ops_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/fakeclock"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/ops"
	"github.com/outboxrelay/outbox/service"
)

// startSampler starts a sampler on spec; with an hourly spec the only
// sample is the one Start takes at once.
func startSampler(t *testing.T, cfg ops.SamplerConfig) *ops.Sampler {
	t.Helper()
	cfg.StaleAfter, cfg.Logger = time.Minute, discard
	s, err := ops.NewSampler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, s)
	return s
}

// sampled is g's value, or -1 while it exports none.
func sampled(g metrics.Sampled) float64 {
	if v, ok := testenv.Value(g); ok {
		return v
	}
	return -1
}

func TestSamplerSetsGauges(t *testing.T) {
	t.Parallel()
	m := metrics.New(nil)
	store := &fakeStore{stats: events.Stats{
		Counts: map[events.Status]int64{events.StatusNew: 7, events.StatusProcessing: 2, events.StatusPublished: 40, events.StatusFailed: 1,
			events.StatusUnknown: 3},
		OldestNew: time.Now().Add(-30 * time.Second),
		Stale:     2,
	}}
	startSampler(t, ops.SamplerConfig{Store: store, Schedule: "@every 1h", Archetype: service.Archetype{Metrics: m}})

	// The sampler sets the gauges one after the other: wait for all.
	want := map[string]float64{"NEW": 7, "PROCESSING": 2, "PUBLISHED": 40, "FAILED": 1, "unknown": 3, "oldest_new_age_over_30s": 1, "stale": 2}
	gauges := func() map[string]float64 {
		got := map[string]float64{}
		for _, status := range []string{"NEW", "PROCESSING", "PUBLISHED", "FAILED", "unknown"} {
			got[status] = testutil.ToFloat64(m.Events.WithLabelValues(status))
		}
		if age := sampled(m.OldestNewAge); age >= 30 && age < 40 {
			got["oldest_new_age_over_30s"] = 1
		}
		got["stale"] = sampled(m.StaleProcessing)
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
	startSampler(t, ops.SamplerConfig{Store: store, Held: store, FailedHolds: true, Schedule: "@every 1h", Archetype: service.Archetype{Metrics: m}})
	eventually(t, "held gauges set", func() bool {
		age := sampled(m.OldestHeldAge)
		return sampled(m.HeldAggregates) == 2 && age >= 3600 && age < 3610
	})
	store.mu.Lock()
	defer store.mu.Unlock()
	if !store.failedHolds {
		t.Error("Held asked without failedHolds, want the configured policy")
	}
}

// pausedSource is a PausedSource that returns its list.
type pausedSource []events.Pause

func (p pausedSource) PausedTypes(context.Context) ([]events.Pause, error) { return p, nil }

// TestSamplerPausedTypes: the sample carries the paused types, for
// /status, and the gauge counts them.
func TestSamplerPausedTypes(t *testing.T) {
	t.Parallel()
	m := metrics.New(nil)
	store := &fakeStore{stats: events.Stats{Counts: map[events.Status]int64{}}}
	paused := pausedSource{{Type: "order.paid", By: "ana", Reason: "billing is down"}, {Type: "invoice.sent", By: "bo"}}
	s := startSampler(t, ops.SamplerConfig{Store: store, Paused: paused, Schedule: "@every 1h", Archetype: service.Archetype{Metrics: m}})
	eventually(t, "paused types gauge set", func() bool { return sampled(m.PausedTypes) == 2 })
	sample, ok := s.Latest()
	if diff := cmp.Diff([]events.Pause(paused), sample.Paused); !ok || diff != "" {
		t.Errorf("the sample's paused types (-want +got):\n%s", diff)
	}
}

func TestSamplerCountsFailure(t *testing.T) {
	t.Parallel()
	m := metrics.New(nil)
	store := &fakeStore{stats: events.Stats{Counts: map[events.Status]int64{events.StatusNew: 7}}}
	startSampler(t, ops.SamplerConfig{Store: store, Schedule: "@every 10ms", Archetype: service.Archetype{Metrics: m}})
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

// Only the replica that leads samples: the others send no query and
// export none of the backlog gauges, and a replica that stops leading
// withdraws its figures rather than leave them to go stale.
func TestSamplerSamplesOnlyWhileActive(t *testing.T) {
	t.Parallel()
	m := metrics.New(nil)
	store := &fakeStore{stats: events.Stats{Counts: map[events.Status]int64{events.StatusNew: 7}, OldestNew: time.Now()},
		held: events.HeldStats{Aggregates: 1}}
	var active atomic.Bool
	var asked atomic.Int32
	startSampler(t, ops.SamplerConfig{Store: store, Held: store, Schedule: "@every 10ms", Archetype: service.Archetype{Metrics: m},
		Active: func() bool { asked.Add(1); return active.Load() }})
	exported := func() int {
		n := testutil.CollectAndCount(m.Events)
		for _, g := range []metrics.Sampled{m.OldestNewAge, m.StaleProcessing, m.HeldAggregates, m.OldestHeldAge} {
			n += testutil.CollectAndCount(g)
		}
		return n
	}

	eventually(t, "three runs while not leading", func() bool { return asked.Load() >= 3 })
	if at := store.lastStaleBefore(); !at.IsZero() {
		t.Errorf("a replica that does not lead queried the stats (staleBefore %s)", at)
	}
	if n := exported(); n != 0 {
		t.Errorf("a replica that does not lead exports %d backlog series, want 0", n)
	}

	active.Store(true)
	eventually(t, "the leader exports every backlog gauge", func() bool {
		return exported() == len(events.CountedStatuses)+4 && testutil.ToFloat64(m.Events.WithLabelValues("NEW")) == 7
	})

	active.Store(false)
	eventually(t, "a replica that stops leading withdraws the gauges", func() bool { return exported() == 0 })
}

// The leader keeps its last sample for /status, with the time it was
// taken by the sampler's clock.
func TestSamplerKeepsTheLastSample(t *testing.T) {
	t.Parallel()
	clock := fakeclock.New(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	store := &fakeStore{stats: events.Stats{Counts: map[events.Status]int64{events.StatusNew: 7}}, held: events.HeldStats{Aggregates: 2}}
	s := startSampler(t, ops.SamplerConfig{Store: store, Held: store, Schedule: "@every 1h", Archetype: service.Archetype{Now: clock.Now}})
	var got ops.Sample
	eventually(t, "the first sample", func() bool {
		var ok bool
		got, ok = s.Latest()
		return ok
	})
	want := ops.Sample{At: clock.Now(), Stats: store.stats, Held: &events.HeldStats{Aggregates: 2}, HeldAt: clock.Now()}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Latest (-want +got):\n%s", diff)
	}
}

// A held read that fails gives way: the sample still has the counts, and
// keeps the last held figures with the time they were read, so that a
// slow held read on a large backlog does not fail every sample.
func TestSamplerKeepsTheLastHeldWhenItsReadFails(t *testing.T) {
	t.Parallel()
	first := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	clock := fakeclock.New(first)
	store := &fakeStore{stats: events.Stats{Counts: map[events.Status]int64{events.StatusNew: 7}}, held: events.HeldStats{Aggregates: 2}}
	m := metrics.New(nil)
	s := startSampler(t, ops.SamplerConfig{Store: store, Held: store, Schedule: "@every 1h", Archetype: service.Archetype{Now: clock.Now, Metrics: m}})
	eventually(t, "the first sample", func() bool { _, ok := s.Latest(); return ok })

	store.mu.Lock()
	store.heldErr = context.DeadlineExceeded
	store.held = events.HeldStats{Aggregates: 99} // never read
	store.stats = events.Stats{Counts: map[events.Status]int64{events.StatusNew: 5}}
	store.mu.Unlock()
	clock.Advance(time.Minute)
	s.Trigger()
	var got ops.Sample
	eventually(t, "the second sample", func() bool {
		got, _ = s.Latest()
		return got.At.Equal(first.Add(time.Minute))
	})
	want := ops.Sample{At: first.Add(time.Minute), Stats: events.Stats{Counts: map[events.Status]int64{events.StatusNew: 5}},
		Held: &events.HeldStats{Aggregates: 2}, HeldAt: first}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Latest after a failed held read (-want +got):\n%s", diff)
	}
	if n := testutil.ToFloat64(m.JobErrors.WithLabelValues("sampler")); n != 1 {
		t.Errorf("sampler job errors = %v, want 1 (the held read)", n)
	}
	if got := sampled(m.HeldAggregates); got != 2 {
		t.Errorf("held aggregates gauge = %v, want the last read, 2", got)
	}
}

// A replica that does not lead samples only when /status asks, and then
// at most once per period however often it asks: its Stats are read once
// for many requests, again once the sample is a period old.
func TestSamplerSamplesForStatusOnDemand(t *testing.T) {
	t.Parallel()
	clock := fakeclock.New(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	store := &countingStore{fakeStore: fakeStore{stats: events.Stats{Counts: map[events.Status]int64{events.StatusNew: 7}}}}
	m := metrics.New(nil)
	s := startSampler(t, ops.SamplerConfig{Store: store, Schedule: "@every 1h", Archetype: service.Archetype{Now: clock.Now, Metrics: m},
		Active: func() bool { return false }})
	if _, ok := s.Latest(); ok {
		t.Fatal("Latest on a replica that does not lead gave a sample before any was taken")
	}
	eventually(t, "the sample /status asked for", func() bool { _, ok := s.Latest(); return ok })
	for range 20 {
		if _, ok := s.Latest(); !ok {
			t.Fatal("Latest lost its sample")
		}
	}
	clock.Advance(15 * time.Second)
	s.Latest() // a period old: asks again
	eventually(t, "a second sample a period later", func() bool {
		got, _ := s.Latest()
		return got.At.Equal(clock.Now())
	})
	if n := store.calls.Load(); n != 2 {
		t.Errorf("Stats read %d times for 22 requests over one period, want 2", n)
	}
	if n := testutil.CollectAndCount(m.Events); n != 0 {
		t.Errorf("a replica that does not lead exports %d backlog series after sampling for /status, want 0", n)
	}
}

// countingStore counts Stats calls.
type countingStore struct {
	fakeStore
	calls atomic.Int32
}

func (s *countingStore) Stats(ctx context.Context, staleBefore time.Time) (events.Stats, error) {
	s.calls.Add(1)
	return s.fakeStore.Stats(ctx, staleBefore)
}

// While claims are slow, scheduled samples are left out and counted.
func TestSamplerYieldsWhileClaimsAreSlow(t *testing.T) {
	t.Parallel()
	m := metrics.New(nil)
	store := &countingStore{fakeStore: fakeStore{stats: events.Stats{Counts: map[events.Status]int64{}}}}
	startSampler(t, ops.SamplerConfig{Store: store, Schedule: "@every 10ms", Archetype: service.Archetype{Metrics: m}, Yield: func() bool { return true }})
	eventually(t, "ten samples left out", func() bool {
		return testutil.ToFloat64(m.RunsLeftOut.WithLabelValues("sampler")) >= 10
	})
	left := testutil.ToFloat64(m.RunsLeftOut.WithLabelValues("sampler"))
	if n := float64(store.calls.Load()); n >= left {
		t.Errorf("%v samples taken while %v were left out, want fewer taken (the gap doubles)", n, left)
	}
}

// slowStats is a store whose Stats run out of their time while slow is
// set, and records the time each call was given.
type slowStats struct {
	fakeStore
	mu    sync.Mutex
	slow  bool
	given []time.Duration
}

func (s *slowStats) Stats(ctx context.Context, staleBefore time.Time) (events.Stats, error) {
	deadline, _ := ctx.Deadline()
	s.mu.Lock()
	s.given = append(s.given, time.Until(deadline))
	slow := s.slow
	s.mu.Unlock()
	if slow {
		<-ctx.Done()
		return events.Stats{}, ctx.Err()
	}
	return s.fakeStore.Stats(ctx, staleBefore)
}

// A sample whose read ran out of its time gives the next sample's reads
// twice as long, up to eight times the configured time, and a sample that
// finished gives back half: counting a large backlog on a slow database
// finishes in time once, instead of failing every run.
func TestSamplerGivesASlowReadMoreTime(t *testing.T) {
	t.Parallel()
	store := &slowStats{slow: true}
	const base = 100 * time.Millisecond
	s := startSampler(t, ops.SamplerConfig{Store: store, Schedule: "@every 1h", Timeout: base})
	calls := func() int {
		store.mu.Lock()
		defer store.mu.Unlock()
		return len(store.given)
	}
	for want := 1; want <= 5; want++ {
		if want > 1 {
			s.Trigger()
		}
		eventually(t, fmt.Sprintf("sample %d", want), func() bool { return calls() >= want })
	}
	store.mu.Lock()
	store.slow = false
	store.mu.Unlock()
	for want := 6; want <= 7; want++ {
		s.Trigger()
		eventually(t, fmt.Sprintf("sample %d", want), func() bool { return calls() >= want })
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	// Each slow sample doubles the next one's time, to 8x; the two that
	// finished get 8x, then 4x. What a read sees left of its time is less
	// than it was given, by how late it started, but more than the level
	// below, half of it: a busy host delays a read by less than that.
	for i, growth := range []int{1, 2, 4, 8, 8, 8, 4} {
		want := time.Duration(growth) * base
		if got := store.given[i]; got > want || got <= want/2 {
			t.Errorf("sample %d's read was given %s, want about %s", i+1, got, want)
		}
	}
}
