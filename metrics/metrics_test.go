package metrics_test

import (
	"testing"

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
