package main

import (
	"context"
	"io"

	"github.com/outboxrelay/outbox/internal/gcfloor"
)

// gcFloor is the heap the relay lets grow before the garbage collector
// runs (package gcfloor), unless GOGC or GOMEMLIMIT says otherwise. A
// worker relaying small events holds 3 to 5 MB live, and collecting each
// time that doubled was a fifth of its CPU. With this floor a 1-replica
// drain used 22 to 24 ms of CPU per 1,000 events instead of 27 to 30, and
// peaked at 39 to 43 MB of RSS instead of 23 (docs/performance.md). A heap
// of large documents is past it and collected as before.
const gcFloor = 16 << 20

// runCommand is `worker run`: the relay.
func runCommand(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	cfg, _, err := loadConfig("run", args, getenv, relayCommand, nil)
	if err != nil {
		return err
	}
	logger := newLogger(cfg, stderr)
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
