package metrics_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/outbox/metrics"
)

// TestOutboxLabel: the collectors of each outbox carry its label, those
// of the process (the build, the database commands) carry none and are
// exported once, and two outboxes on one registry do not collide.
func TestOutboxLabel(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	process := metrics.NewProcess(reg)
	a := metrics.NewOutbox(prometheus.WrapRegistererWith(prometheus.Labels{"outbox": "a"}, reg), process)
	b := metrics.NewOutbox(prometheus.WrapRegistererWith(prometheus.Labels{"outbox": "b"}, reg), process)
	a.Published.Add(3)
	b.Published.Add(5)
	a.DBCommands.WithLabelValues("find").Inc()
	b.DBCommands.WithLabelValues("find").Inc()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var outbox string
			for _, l := range m.GetLabel() {
				if l.GetName() == "outbox" {
					outbox = l.GetValue()
				}
			}
			switch mf.GetName() {
			case "outbox_build_info", "outbox_db_commands_total":
				if outbox != "" {
					t.Errorf("%s has outbox %q, want no outbox label: it is the process's", mf.GetName(), outbox)
				}
			default:
				if outbox != "a" && outbox != "b" {
					t.Errorf("%s has outbox %q, want a or b", mf.GetName(), outbox)
				}
			}
			if mf.GetName() == "outbox_events_published_total" {
				if want := map[string]float64{"a": 3, "b": 5}[outbox]; m.GetCounter().GetValue() != want {
					t.Errorf("outbox_events_published_total{outbox=%q} = %v, want %v", outbox, m.GetCounter().GetValue(), want)
				}
			}
			if mf.GetName() == "outbox_db_commands_total" && m.GetLabel()[0].GetValue() == "find" && m.GetCounter().GetValue() != 2 {
				t.Errorf("outbox_db_commands_total{command=find} = %v, want 2: one counter for the process", m.GetCounter().GetValue())
			}
		}
	}
}

// TestOutboxUnregister: an outbox's collectors leave the registry with
// Unregister, the process's and the other outboxes' stay.
func TestOutboxUnregister(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	process := metrics.NewProcess(reg)
	a := metrics.NewOutbox(prometheus.WrapRegistererWith(prometheus.Labels{"outbox": "a"}, reg), process)
	metrics.NewOutbox(prometheus.WrapRegistererWith(prometheus.Labels{"outbox": "b"}, reg), process)
	a.Unregister(prometheus.WrapRegistererWith(prometheus.Labels{"outbox": "a"}, reg))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var builds int
	for _, mf := range mfs {
		if mf.GetName() == "outbox_build_info" {
			builds++
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outbox" && l.GetValue() == "a" {
					t.Errorf("%s{outbox=a} still exported after Unregister", mf.GetName())
				}
			}
		}
	}
	if builds != 1 {
		t.Errorf("outbox_build_info exported %d times, want once", builds)
	}
	// The same outbox can be registered again, as a reload that changes
	// it does.
	metrics.NewOutbox(prometheus.WrapRegistererWith(prometheus.Labels{"outbox": "a"}, reg), process)
}
