// Package servicetest gives tests the service.Archetype they mostly want:
// quiet, with metrics of their own, on the clock the test sets.
package servicetest

import (
	"log/slog"
	"time"

	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/service"
)

// Archetype returns an Archetype whose logger discards everything, whose
// metrics are a fresh unregistered set (a test reads its own counters,
// untouched by any other test's), and whose Now is now.
func Archetype(now func() time.Time) service.Archetype {
	return service.Archetype{Logger: slog.New(slog.DiscardHandler), Metrics: metrics.New(nil), Now: now}
}
