package metrics_test

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxrelay/outbox/metrics"
)

func TestOrNew(t *testing.T) {
	t.Parallel()
	m := metrics.New(nil)
	if got := metrics.OrNew(m); got != m {
		t.Errorf("OrNew(m) = %p, want m itself (%p)", got, m)
	}
	if got := metrics.OrNew(nil); got == nil || got.Claimed == nil {
		t.Errorf("OrNew(nil) = %+v, want a new set with its collectors", got)
	}
}

// The left-out runs of every periodic job are exported from the start, at
// 0, so that a rate over them has a series before the first slow claim.
func TestRunsLeftOutExportedAtZero(t *testing.T) {
	t.Parallel()
	m := metrics.New(nil)
	if n := testutil.CollectAndCount(m.RunsLeftOut); n != len(metrics.YieldingJobs) {
		t.Errorf("job_runs_left_out_total exports %d series, want %d (one per job)", n, len(metrics.YieldingJobs))
	}
	for _, job := range metrics.YieldingJobs {
		if v := testutil.ToFloat64(m.RunsLeftOut.WithLabelValues(job)); v != 0 {
			t.Errorf("job_runs_left_out_total{job=%q} = %v, want 0", job, v)
		}
	}
}

// The failed runs of every job and every claim outcome are exported from
// the start at 0: a rate over them, and an alert that compares claim
// errors with claim successes, has a series before the first event.
func TestJobErrorsAndClaimRunsExportedAtZero(t *testing.T) {
	t.Parallel()
	m := metrics.New(nil)
	for _, tc := range []struct {
		name string
		vec  interface {
			WithLabelValues(...string) prometheus.Counter
		}
		c      prometheus.Collector
		labels []string
	}{
		{"job_errors_total", m.JobErrors, m.JobErrors, metrics.Jobs},
		{"claim_runs_total", m.ClaimRuns, m.ClaimRuns, metrics.ClaimOutcomes},
	} {
		if n := testutil.CollectAndCount(tc.c); n != len(tc.labels) {
			t.Errorf("%s exports %d series, want %d", tc.name, n, len(tc.labels))
		}
		for _, l := range tc.labels {
			if v := testutil.ToFloat64(tc.vec.WithLabelValues(l)); v != 0 {
				t.Errorf("%s{%s} = %v, want 0", tc.name, l, v)
			}
		}
	}
	if v := testutil.ToFloat64(m.PartitionsOwned); v != 0 {
		t.Errorf("partitions_owned = %v, want 0 before a round", v)
	}
}

// Every FAILED reason is exported from the start, at 0, so that the first
// failure of a replica (timeout included) is a rise that rate() sees.
func TestFailedReasonsExportedAtZero(t *testing.T) {
	t.Parallel()
	m := metrics.New(nil)
	if n := testutil.CollectAndCount(m.Failed); n != len(metrics.FailedReasons) {
		t.Errorf("outbox_events_failed_total has %d series at start, want %d", n, len(metrics.FailedReasons))
	}
	for _, reason := range []string{metrics.ReasonInvalid, metrics.ReasonRejected, metrics.ReasonMaxAttempts,
		metrics.ReasonStaleMaxAttempts, metrics.ReasonTimeout} {
		if !slices.Contains(metrics.FailedReasons, reason) {
			t.Errorf("FailedReasons lacks %q", reason)
		}
		if v := testutil.ToFloat64(m.Failed.WithLabelValues(reason)); v != 0 {
			t.Errorf("failed{reason=%q} = %v at start, want 0", reason, v)
		}
	}
}
