package deploy

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/outboxrelay/outbox/metrics"
)

// targetLabels are the labels Prometheus adds to every scraped series
// (job, instance; namespace, pod and container from the PodMonitor), and
// exported_job: the worker's own "job" label, renamed because it collides
// with the scrape job.
var targetLabels = map[string]bool{
	"job": true, "instance": true, "namespace": true, "pod": true, "container": true,
	"exported_job": true,
}

// workerMetrics lists every series name the worker exports with its label
// names, read from a fresh registry wired as the worker wires it: the
// process's collectors as they are, an outbox's with its outbox label. A
// vector exports nothing until it has a child, so each one gets one first.
func workerMetrics(t *testing.T) map[string]map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := metrics.NewOutbox(prometheus.WrapRegistererWith(prometheus.Labels{"outbox": "default"}, reg), metrics.NewProcess(reg))
	v := reflect.ValueOf(m).Elem()
	for i := range v.NumField() {
		if err := touch(v.Field(i).Interface()); err != nil {
			t.Fatalf("metrics.Metrics.%s: %v", v.Type().Field(i).Name, err)
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]bool{}
	for _, f := range families {
		lbls := map[string]bool{}
		for _, l := range f.GetMetric()[0].GetLabel() {
			lbls[l.GetName()] = true
		}
		name := f.GetName()
		if f.GetType() == dto.MetricType_HISTOGRAM {
			bucket := map[string]bool{"le": true}
			for l := range lbls {
				bucket[l] = true
			}
			out[name+"_bucket"] = bucket
			out[name+"_sum"] = lbls
			out[name+"_count"] = lbls
			continue
		}
		out[name] = lbls
	}
	if len(out) == 0 {
		t.Fatal("metrics.New registered nothing")
	}
	return out
}

// maxLabels is the most labels touch tries; outbox_build_info has six.
const maxLabels = 10

// touch creates one child of a metric vector, whatever its number of
// labels; plain metrics need nothing.
func touch(c any) error {
	if g, ok := c.(metrics.Sampled); ok {
		g.Set(0) // exported only by the sampling replica
		return nil
	}
	lv := reflect.ValueOf(c).MethodByName("GetMetricWithLabelValues")
	if !lv.IsValid() {
		return nil
	}
	for n := 1; n <= maxLabels; n++ {
		args := make([]reflect.Value, n)
		for i := range args {
			args[i] = reflect.ValueOf("x")
		}
		res := lv.Call(args)
		if res[1].IsNil() {
			return nil
		}
	}
	return fmt.Errorf("%T: no label count from 1 to %d fits", c, maxLabels)
}

// selectors parses a PromQL query and returns its vector selectors, each
// with the labels the aggregations around it group by.
func selectors(query string) ([]selector, error) {
	expr, err := parser.NewParser(parser.Options{}).ParseExpr(query)
	if err != nil {
		return nil, fmt.Errorf("parse %q: %w", strings.TrimSpace(query), err)
	}
	var out []selector
	parser.Inspect(expr, func(n parser.Node, path []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		s := selector{name: vs.Name, matchers: vs.LabelMatchers}
		for _, p := range path {
			if a, ok := p.(*parser.AggregateExpr); ok && !a.Without {
				s.grouping = append(s.grouping, a.Grouping...)
			}
		}
		out = append(out, s)
		return nil
	})
	if len(out) == 0 {
		return nil, fmt.Errorf("%q selects no series", strings.TrimSpace(query))
	}
	for _, s := range out {
		if s.name == "" {
			return nil, fmt.Errorf("%q: a selector without a metric name", strings.TrimSpace(query))
		}
	}
	return out, nil
}
