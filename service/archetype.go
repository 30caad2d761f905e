// Package service holds what every service of the worker is given alike:
// its logger, its metrics, its tracer provider and its clocks. The worker
// builds one Archetype and each service's Config embeds it, so that they
// are wired once and given their defaults in one place.
package service

import (
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/outboxrelay/outbox/metrics"
)

// Archetype is the logger, the metrics, the tracer provider and the clocks
// a service runs with.
// The zero value is usable: WithDefaults fills what is unset.
type Archetype struct {
	// Logger receives the service's log lines. Defaults to slog.Default().
	Logger *slog.Logger
	// Metrics receives the service's counters and gauges. Defaults to an
	// unregistered set, built only when it is needed.
	Metrics *metrics.Metrics
	// Tracer starts the service's spans. Defaults to a no-op provider, so
	// that a worker without tracing pays nothing for it on the hot path.
	Tracer trace.TracerProvider
	// Now is the clock of the times a service compares with those stored
	// in the outbox (processingAt, publishedAt, createdAt, the terms of
	// ownership): the worker passes the database server's time
	// (mongo.Clock.Now), because those times were written against it, and
	// a replica whose own clock is off would otherwise misjudge them.
	// Defaults to time.Now.
	Now func() time.Time
	// Local is the local clock a service measures intervals on (a
	// deadline, how long something took); only intervals between its
	// readings count. Defaults to time.Now, whose intervals are
	// monotonic: a pause of the process counts, a step of the wall clock
	// does not.
	Local func() time.Time
}

// WithDefaults returns a with each unset field given its default.
func (a Archetype) WithDefaults() Archetype {
	if a.Logger == nil {
		a.Logger = slog.Default()
	}
	a.Metrics = metrics.OrNew(a.Metrics)
	if a.Tracer == nil {
		a.Tracer = noop.NewTracerProvider()
	}
	if a.Now == nil {
		a.Now = time.Now
	}
	if a.Local == nil {
		a.Local = time.Now
	}
	return a
}
