package service_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/service"
)

func TestWithDefaults(t *testing.T) {
	t.Parallel()
	got := service.Archetype{}.WithDefaults()
	if got.Logger != slog.Default() {
		t.Errorf("Logger = %v, want slog.Default()", got.Logger)
	}
	if got.Metrics == nil {
		t.Error("Metrics = nil, want an unregistered set")
	}
	if got.Now == nil || time.Since(got.Now()) > time.Minute {
		t.Error("Now is not time.Now")
	}
	if got.Local == nil || time.Since(got.Local()) > time.Minute {
		t.Error("Local is not time.Now")
	}

	logger := slog.New(slog.DiscardHandler)
	m := metrics.New(nil)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := func() time.Time { return at }
	set := service.Archetype{Logger: logger, Metrics: m, Now: clock, Local: clock}.WithDefaults()
	if set.Logger != logger || set.Metrics != m || !set.Now().Equal(at) || !set.Local().Equal(at) {
		t.Errorf("WithDefaults replaced a field that was set: %+v", set)
	}
}
