package metrics_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/metrics/metricstest"
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

// The series of every labelled counter are exported from the start, at
// 0, so that a rate over them, and an alert that compares claim errors
// with claim successes, has a series before the first event: the left-out
// runs of every periodic job, the failed runs of every job, every claim
// outcome, and every FAILED reason, so that the first failure of a replica
// (timeout included) is a rise that rate() sees.
func TestCounterVecsExportedAtZero(t *testing.T) {
	t.Parallel()
	m := metrics.New(nil)
	for _, tc := range []struct {
		name   string
		vec    *prometheus.CounterVec
		labels []string
	}{
		{"job_runs_left_out_total", m.RunsLeftOut, metrics.YieldingJobs},
		{"job_errors_total", m.JobErrors, metrics.Jobs},
		{"claim_runs_total", m.ClaimRuns, metrics.ClaimOutcomes},
		{"outbox_events_failed_total", m.Failed, metrics.FailedReasons},
	} {
		if n := testutil.CollectAndCount(tc.vec); n != len(tc.labels) {
			t.Errorf("%s exports %d series at start, want %d (one per label value)", tc.name, n, len(tc.labels))
		}
		for _, l := range tc.labels {
			metricstest.Want(t, fmt.Sprintf("%s{%s} at start", tc.name, l), tc.vec.WithLabelValues(l), 0)
		}
	}
	metricstest.Want(t, "partitions_owned before a round", m.PartitionsOwned, 0)
}

// FailedReasons, the reasons exported at 0 above, names every reason.
func TestFailedReasonsNameEveryReason(t *testing.T) {
	t.Parallel()
	for _, reason := range []string{metrics.ReasonInvalid, metrics.ReasonRejected, metrics.ReasonMaxAttempts,
		metrics.ReasonStaleMaxAttempts, metrics.ReasonTimeout} {
		if !slices.Contains(metrics.FailedReasons, reason) {
			t.Errorf("FailedReasons lacks %q", reason)
		}
	}
}
