package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/outboxrelay/outbox/internal/buildinfo"
	"github.com/outboxrelay/outbox/internal/gcfloor"
	"github.com/outboxrelay/outbox/internal/telemetry"
)

// gcFloor is the heap the relay lets grow before the garbage collector
// runs (package gcfloor), unless GOGC or GOMEMLIMIT says otherwise: a
// worker relaying small events holds a few MB live, and collecting each
// time that doubled was a large share of its CPU (docs/performance.md has
// the figures). A heap of large documents is past it and collected as
// before; a cgroup's memory limit still bounds it (applyMemoryLimit).
const gcFloor = 16 << 20

// runCommand is `worker run`: the relay.
func runCommand(ctx context.Context, args []string, getenv func(string) string, environ []string, stderr io.Writer) error {
	cfg, _, err := loadConfig("run", args, withDeprecated(getenv, deprecatedVariables), relayCommand, nil)
	if err != nil {
		return err
	}
	logger := newLogger(cfg, stderr)
	warnUnknownVariables(logger, warnDeprecated(logger, environ, deprecatedVariables))
	applyMemoryLimit(cfg, logger)
	defer startGCFloor(getenv).Stop()
	cfg.Tracing.InstanceID = cfg.WorkerID
	cfg.Tracing.ServiceVersion = buildinfo.Read().Version
	tracer, err := telemetry.New(ctx, cfg.Tracing, logger)
	if err != nil {
		return err
	}
	w, err := newWorker(cfg, logger, tracer)
	if err != nil {
		_ = tracer.Shutdown(context.WithoutCancel(ctx)) // nothing was traced yet
		return err
	}
	// SIGHUP reloads the outboxes (reload.go): the fleet file is read
	// again, with the environment, through the same checks as at start.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	w.hup = hup
	w.reload = func() ([]outboxConfig, error) {
		next, _, err := loadConfig("run", args, withDeprecated(getenv, deprecatedVariables), relayCommand, nil)
		return next.Outboxes, err
	}
	return w.run(ctx)
}

// warnUnknownVariables warns about each OUTBOX_ variable of environ that
// the worker does not read (a typo, a missing underscore, would
// otherwise leave its setting at the default without a word), naming the
// setting it may have meant. It does not stop the worker: a variable set
// for another program, or left from an older version, is no reason not to
// relay. Variables of the tests and the benchmark (reservedEnvPrefixes)
// are left alone.
func warnUnknownVariables(logger *slog.Logger, environ []string) {
	for _, u := range unknownVariables(environ) {
		if u.Suggestion != "" {
			logger.Warn("unknown environment variable ignored; did you mean "+u.Suggestion+"?",
				"variable", u.Name, "did_you_mean", u.Suggestion)
			continue
		}
		logger.Warn("unknown environment variable ignored: the worker reads no such setting (docs/configuration.md lists them)",
			"variable", u.Name)
	}
}

// startGCFloor starts the floor of the relay's heap, or returns nil when
// the environment tunes the collector itself.
func startGCFloor(getenv func(string) string) *gcfloor.Floor {
	if getenv("GOGC") != "" || getenv("GOMEMLIMIT") != "" {
		return nil
	}
	return gcfloor.Start(gcFloor)
}
