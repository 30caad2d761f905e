package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/outbox/internal/promset"
)

// Sampled is a gauge of the whole outbox, which one replica samples for
// all of them: it exports nothing until Set and again after Clear, so that
// a replica that stopped sampling shows no figure rather than a stale one.
// Dashboards and alerts take the max across replicas.
type Sampled struct{ vec *prometheus.GaugeVec }

// sampled makes a Sampled gauge in s: a vector without labels, whose one
// series comes and goes.
func sampled(s *promset.Set, name, help string) Sampled {
	return Sampled{vec: s.GaugeVec(name, help)}
}

// Set sets the gauge's value, exporting it.
func (g Sampled) Set(v float64) { g.vec.WithLabelValues().Set(v) }

// Clear removes the gauge's value until the next Set.
func (g Sampled) Clear() { g.vec.Reset() }

// Describe and Collect make a Sampled a prometheus.Collector.
func (g Sampled) Describe(ch chan<- *prometheus.Desc) { g.vec.Describe(ch) }

func (g Sampled) Collect(ch chan<- prometheus.Metric) { g.vec.Collect(ch) }
