package metrics_test

import (
	"reflect"
	"regexp"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/outboxrelay/outbox/metrics"
)

// TestLabelledCountersExportedAtZero scrapes a registry right after New
// and checks that every counter with a label exports every value of its
// label, at 0: a rate() or increase() over a counter whose series appears
// only with its first increment misses that increment, and an alert on it
// has nothing to fire on. A labelled counter added to Metrics fails here
// until its values are listed below (and pre-initialised in New).
func TestLabelledCountersExportedAtZero(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m := metrics.New(reg)
	// The label values of each labelled counter, by metric name.
	want := map[string][]string{
		"outbox_events_failed_total":     metrics.FailedReasons,
		"outbox_events_released_total":   metrics.ReleasedReasons,
		"outbox_claim_runs_total":        metrics.ClaimOutcomes,
		"outbox_job_errors_total":        metrics.Jobs,
		"outbox_job_runs_left_out_total": metrics.YieldingJobs,
		"outbox_db_commands_total":       metrics.DBCommands(),

		// The sequence checks (mongo/sequence.go).
		"outbox_sequence_anomalies_total": metrics.SequenceKinds,
	}

	// Every *prometheus.CounterVec field of Metrics must be listed above.
	v := reflect.ValueOf(m).Elem()
	vecs := 0
	for i := range v.NumField() {
		if vec, ok := v.Field(i).Interface().(*prometheus.CounterVec); ok {
			vecs++
			name := nameOf(t, vec)
			if _, ok := want[name]; !ok {
				t.Errorf("Metrics.%s (%s) is a labelled counter this test does not know: list its label values", v.Type().Field(i).Name, name)
			}
		}
	}
	if vecs != len(want) {
		t.Errorf("Metrics has %d labelled counters, the test lists %d", vecs, len(want))
	}

	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	got := map[string][]string{}
	for _, f := range families {
		if _, ok := want[f.GetName()]; !ok {
			continue
		}
		if f.GetType() != dto.MetricType_COUNTER {
			t.Errorf("%s is a %s, want a counter", f.GetName(), f.GetType())
		}
		for _, s := range f.GetMetric() {
			if len(s.GetLabel()) != 1 {
				t.Errorf("%s has a series with labels %v, want exactly one label", f.GetName(), s.GetLabel())
				continue
			}
			got[f.GetName()] = append(got[f.GetName()], s.GetLabel()[0].GetValue())
			if v := s.GetCounter().GetValue(); v != 0 {
				t.Errorf("%s{%s} = %v at start, want 0", f.GetName(), s.GetLabel()[0].GetValue(), v)
			}
		}
	}
	for name, values := range want {
		values = slices.Sorted(slices.Values(values))
		g := slices.Sorted(slices.Values(got[name]))
		if diff := cmp.Diff(values, g); diff != "" {
			t.Errorf("%s series at start (-want +got):\n%s", name, diff)
		}
	}
}

// nameOf is the fully qualified name of a collector's one metric, read
// from its Desc (the only place a Vec with no series yet shows it).
func nameOf(t *testing.T, c prometheus.Collector) string {
	t.Helper()
	ch := make(chan *prometheus.Desc, 1)
	c.Describe(ch)
	m := regexp.MustCompile(`fqName: "([^"]+)"`).FindStringSubmatch((<-ch).String())
	if m == nil {
		t.Fatalf("no fqName in the Desc of %T", c)
	}
	return m[1]
}
