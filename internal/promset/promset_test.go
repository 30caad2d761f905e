package promset_test

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/outbox/internal/promset"
)

func TestSetNamesAndRegisters(t *testing.T) {
	t.Parallel()
	s := promset.New("outbox", "inbox")
	s.Counter("processed_total", "h")
	s.CounterVec("rejected_total", "h", "reason").WithLabelValues("x")
	s.Gauge("held", "h")
	s.GaugeVec("events", "h", "status").WithLabelValues("NEW")
	s.Histogram("duration_seconds", "h", []float64{1})
	reg := prometheus.NewRegistry()
	if err := s.Register(reg); err != nil {
		t.Fatalf("Register: %v", err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, mf := range mfs {
		got = append(got, mf.GetName())
	}
	want := []string{"outbox_inbox_duration_seconds", "outbox_inbox_events", "outbox_inbox_held", "outbox_inbox_processed_total", "outbox_inbox_rejected_total"}
	if !slices.Equal(got, want) {
		t.Errorf("registered %q, want %q", got, want)
	}
	if err := s.Register(reg); err == nil {
		t.Error("second Register on the same registry: no error, want one")
	}
	if err := s.Register(nil); err != nil {
		t.Errorf("Register(nil) = %v, want nil", err)
	}
}
