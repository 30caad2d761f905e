package main

import (
	"context"
	"io"

	"github.com/outboxrelay/outbox/internal/gcfloor"
)

// gcFloor is the heap the relay lets grow before the garbage collector
// runs (package gcfloor), unless GOGC or GOMEMLIMIT says otherwise: a
// worker relaying small events holds a few MB live, and collecting each
// time that doubled was a large share of its CPU (docs/performance.md has
// the figures). A heap of large documents is past it and collected as
// before; a cgroup's memory limit still bounds it (applyMemoryLimit).
const gcFloor = 16 << 20

// runCommand is `worker run`: the relay.
func runCommand(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	cfg, _, err := loadConfig("run", args, getenv, relayCommand, nil)
	if err != nil {
		return err
	}
	logger := newLogger(cfg, stderr)
	applyMemoryLimit(cfg, logger)
	defer startGCFloor(getenv).Stop()
	w, err := newWorker(cfg, logger)
	if err != nil {
		return err
	}
	return w.run(ctx)
}

// startGCFloor starts the floor of the relay's heap, or returns nil when
// the environment tunes the collector itself.
func startGCFloor(getenv func(string) string) *gcfloor.Floor {
	if getenv("GOGC") != "" || getenv("GOMEMLIMIT") != "" {
		return nil
	}
	return gcfloor.Start(gcFloor)
}
