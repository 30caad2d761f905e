// Package promset makes Prometheus collectors named in one namespace and
// subsystem, and registers them together: the worker's metrics and the
// inbox's are each one Set, so that each collector is one line of name and
// help.
package promset

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"
)

// Set makes collectors and keeps them for Register.
type Set struct {
	namespace, subsystem string
	collectors           []prometheus.Collector
}

// New returns a Set whose collectors are named namespace_subsystem_name,
// or namespace_name when subsystem is empty.
func New(namespace, subsystem string) *Set {
	return &Set{namespace: namespace, subsystem: subsystem}
}

// Register registers every collector made so far with reg and returns the
// first error; a nil reg registers nothing.
func (s *Set) Register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range s.collectors {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// RegisterExcept registers every collector made so far but those of skip
// with reg, and returns the first error; a nil reg registers nothing.
func (s *Set) RegisterExcept(reg prometheus.Registerer, skip ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for _, c := range s.collectors {
		if slices.Contains(skip, c) {
			continue
		}
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func keep[C prometheus.Collector](s *Set, c C) C {
	s.collectors = append(s.collectors, c)
	return c
}

func (s *Set) opts(name, help string) prometheus.Opts {
	return prometheus.Opts{Namespace: s.namespace, Subsystem: s.subsystem, Name: name, Help: help}
}

// Counter makes a counter.
func (s *Set) Counter(name, help string) prometheus.Counter {
	return keep(s, prometheus.NewCounter(prometheus.CounterOpts(s.opts(name, help))))
}

// CounterVec makes a counter with labels.
func (s *Set) CounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return keep(s, prometheus.NewCounterVec(prometheus.CounterOpts(s.opts(name, help)), labels))
}

// Gauge makes a gauge.
func (s *Set) Gauge(name, help string) prometheus.Gauge {
	return keep(s, prometheus.NewGauge(prometheus.GaugeOpts(s.opts(name, help))))
}

// GaugeVec makes a gauge with labels.
func (s *Set) GaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return keep(s, prometheus.NewGaugeVec(prometheus.GaugeOpts(s.opts(name, help)), labels))
}

// Histogram makes a histogram with the given bucket bounds.
func (s *Set) Histogram(name, help string, buckets []float64) prometheus.Histogram {
	return keep(s, prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: s.namespace, Subsystem: s.subsystem, Name: name, Help: help, Buckets: buckets,
	}))
}
