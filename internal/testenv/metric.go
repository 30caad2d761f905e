package testenv

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Value is the value of a collector of one series, and whether it exports
// one now: the backlog gauges export nothing on a replica that does not
// sample, where testutil.ToFloat64 would panic.
func Value(c prometheus.Collector) (float64, bool) {
	if testutil.CollectAndCount(c) == 0 {
		return 0, false
	}
	return testutil.ToFloat64(c), true
}
