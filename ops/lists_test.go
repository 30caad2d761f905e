package ops_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/ops"
	"github.com/outboxrelay/outbox/service"
)

// listSource is a FailuresSource and a HoldersSource whose answers can
// be changed, and which records what it was asked.
type listSource struct {
	mu          sync.Mutex
	groups      []events.FailureGroup
	holders     []events.Holder
	err         error
	limits      []int // as asked, groups' then holders'
	failedHolds bool
}

func (l *listSource) FailureGroups(_ context.Context, now time.Time, limit int) (events.FailureGroups, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.limits = append(l.limits, limit)
	return events.FailureGroups{At: now, Groups: l.groups, Read: len(l.groups)}, l.err
}

func (l *listSource) Holders(_ context.Context, _ time.Time, failedHolds bool, limit int) ([]events.Holder, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.limits = append(l.limits, limit)
	l.failedHolds = failedHolds
	return l.holders, false, l.err
}

func (l *listSource) set(groups []events.FailureGroup, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.groups, l.err = groups, err
}

// TestSamplerKeepsTheConsolesLists: with Failures and Holders the
// sampler reads the failure groups and the holders at each sample and
// keeps them (LatestGroups, LatestHolders), bounded; a read that fails
// keeps the last good lists and counts as a job error, and counts that
// fail do not stop the lists.
func TestSamplerKeepsTheConsolesLists(t *testing.T) {
	t.Parallel()
	m := metrics.New(nil)
	store := &fakeStore{stats: events.Stats{Counts: map[events.Status]int64{}}}
	lists := &listSource{
		groups:  []events.FailureGroup{{Reason: "max_attempts", Cause: "broker nacked <n>", Count: 3, Example: "e-1"}},
		holders: []events.Holder{{Key: "order/1"}},
	}
	s := startSampler(t, ops.SamplerConfig{
		Store: store, Held: store, FailedHolds: true, Failures: lists, Holders: lists,
		Schedule: "@every 10ms", Archetype: service.Archetype{Metrics: m},
	})
	eventually(t, "the lists kept", func() bool {
		g, gok := s.LatestGroups()
		h, hok := s.LatestHolders()
		return gok && hok && len(g.Groups) == 1 && g.Groups[0].Count == 3 && !g.At.IsZero() && len(h.List) == 1 && !h.At.IsZero()
	})
	lists.mu.Lock()
	if len(lists.limits) < 2 || lists.limits[0] != ops.FailureGroupsLimit || lists.limits[1] != ops.HoldersLimit || !lists.failedHolds {
		t.Errorf("asked with limits %v and failedHolds %v, want %d and %d, and the configured policy",
			lists.limits, lists.failedHolds, ops.FailureGroupsLimit, ops.HoldersLimit)
	}
	lists.mu.Unlock()

	lists.set(nil, errors.New("server selection timeout"))
	eventually(t, "a failed read counts as a sampler job error", func() bool {
		return testutil.ToFloat64(m.JobErrors.WithLabelValues("sampler")) >= 1
	})
	if g, ok := s.LatestGroups(); !ok || len(g.Groups) != 1 {
		t.Errorf("groups after a failed read = %+v, %v; want the last good ones", g, ok)
	}

	store.setStats(events.Stats{}, errors.New("count timed out"))
	lists.set([]events.FailureGroup{{Cause: "a", Count: 1}, {Cause: "b", Count: 1}}, nil)
	eventually(t, "the groups read while the counts fail", func() bool {
		g, _ := s.LatestGroups()
		return len(g.Groups) == 2
	})
}

// TestSamplerWithoutListsReadsNone: the worker's sampler (no Failures,
// no Holders) keeps no list.
func TestSamplerWithoutListsReadsNone(t *testing.T) {
	t.Parallel()
	store := &fakeStore{stats: events.Stats{Counts: map[events.Status]int64{events.StatusNew: 1}}}
	s := startSampler(t, ops.SamplerConfig{Store: store, Held: store, Schedule: "@every 1h", Archetype: service.Archetype{Metrics: metrics.New(nil)}})
	eventually(t, "a sample", func() bool { _, ok := s.Latest(); return ok })
	if _, ok := s.LatestGroups(); ok {
		t.Error("LatestGroups answers without Failures")
	}
	if _, ok := s.LatestHolders(); ok {
		t.Error("LatestHolders answers without Holders")
	}
}
