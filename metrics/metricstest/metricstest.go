// Package metricstest checks the values of the worker's metrics in tests,
// one line a metric. It sits next to package metrics, as net/http/httptest
// does next to net/http, and is imported only from _test.go files, so that
// package metrics imports no testing code.
package metricstest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Want reports an error unless c, a collector of a single series such as
// a counter or one label's child of a vector, reads want. what names the
// series in the message, e.g. "job_errors{job=recovery}".
func Want(t testing.TB, what string, c prometheus.Collector, want float64) {
	t.Helper()
	if got := testutil.ToFloat64(c); got != want {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}
