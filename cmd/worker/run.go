package main

import (
	"context"
	"io"
)

// runCommand is `worker run`: the relay.
func runCommand(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	cfg, _, err := loadConfig("run", args, getenv, relayCommand, nil)
	if err != nil {
		return err
	}
	logger := newLogger(cfg, stderr)
	applyMemoryLimit(cfg, logger)
	w, err := newWorker(cfg, logger)
	if err != nil {
		return err
	}
	return w.run(ctx)
}
