package metricstest_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/outbox/metrics/metricstest"
)

// recorder is a testing.TB that keeps the errors reported to it.
type recorder struct {
	testing.TB
	errors int
}

func (r *recorder) Helper()               {}
func (r *recorder) Errorf(string, ...any) { r.errors++ }

func TestWant(t *testing.T) {
	t.Parallel()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "c"})
	c.Add(2)
	r := &recorder{TB: t}
	metricstest.Want(r, "c", c, 2)
	if r.errors != 0 {
		t.Errorf("Want(2) on a counter at 2 reported %d errors, want none", r.errors)
	}
	metricstest.Want(r, "c", c, 3)
	if r.errors != 1 {
		t.Errorf("Want(3) on a counter at 2 reported %d errors, want 1", r.errors)
	}
}
