// Package envflag reads the settings of the demo commands (producer,
// consumer): a flag, else its environment variable, else the flag's
// default; and runs such a command with the exit codes the worker uses.
// The worker has its own, richer, settings table in cmd/worker.
package envflag

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/outboxrelay/outbox/internal/redact"
)

// Binding ties a flag to the environment variable read when the flag is
// not given.
type Binding struct {
	Flag, Env string
}

// Parse parses args into fs, refuses positional arguments, then sets each
// bound flag that args did not give from its environment variable, if set.
// An error names the variable and its value, credentials hidden.
func Parse(fs *flag.FlagSet, args []string, getenv func(string) string, bindings []Binding) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, b := range bindings {
		v := strings.TrimSpace(getenv(b.Env))
		if given[b.Flag] || v == "" {
			continue
		}
		if err := fs.Set(b.Flag, v); err != nil {
			return fmt.Errorf("%s %q: %w", b.Env, redact.Value(v), err)
		}
	}
	return nil
}

// Main runs a demo command named name: parse reads its settings from the
// command line and the environment; -h exits 0, a bad setting exits 2.
// Then run runs until SIGINT or SIGTERM; a failure exits 1. The logger
// writes JSON to standard error.
func Main[C any](name string, parse func(args []string, getenv func(string) string) (C, error), run func(context.Context, C, *slog.Logger) error) {
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	cfg, err := parse(os.Args[1:], os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		logger.Error("invalid configuration", "error", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err = run(ctx, cfg, logger)
	stop()
	if err != nil {
		logger.Error(name+" failed", "error", err)
		os.Exit(1)
	}
}
