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
	"time"

	"github.com/outboxrelay/outbox/internal/redact"
)

// Set is a command's flags, each tied to the environment variable read
// when the flag is not given. A flag and its variable are declared in one
// call, and the usage text names the variable, so the two cannot drift.
type Set struct {
	fs  *flag.FlagSet
	env []binding
}

type binding struct{ flag, env string }

// NewSet returns an empty Set for the command name. Parse reports -h as
// flag.ErrHelp, after printing the flags to standard error.
func NewSet(name string) *Set {
	return &Set{fs: flag.NewFlagSet(name, flag.ContinueOnError)}
}

// String defines a string flag name, read from env when not given.
func (s *Set) String(p *string, name, env, value, usage string) {
	s.fs.StringVar(p, name, value, s.bind(name, env, usage))
}

// Int defines an int flag name, read from env when not given.
func (s *Set) Int(p *int, name, env string, value int, usage string) {
	s.fs.IntVar(p, name, value, s.bind(name, env, usage))
}

// Float64 defines a float64 flag name, read from env when not given.
func (s *Set) Float64(p *float64, name, env string, value float64, usage string) {
	s.fs.Float64Var(p, name, value, s.bind(name, env, usage))
}

// Duration defines a duration flag name, read from env when not given.
func (s *Set) Duration(p *time.Duration, name, env string, value time.Duration, usage string) {
	s.fs.DurationVar(p, name, value, s.bind(name, env, usage))
}

func (s *Set) bind(name, env, usage string) string {
	s.env = append(s.env, binding{flag: name, env: env})
	return usage + " (env " + env + ")"
}

// Parse parses args, refuses positional arguments, then sets each flag
// that args did not give from its environment variable, if set. An error
// names the variable and its value, credentials hidden.
func (s *Set) Parse(args []string, getenv func(string) string) error {
	if err := s.fs.Parse(args); err != nil {
		return err
	}
	if s.fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", s.fs.Args())
	}
	given := map[string]bool{}
	s.fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, b := range s.env {
		v := strings.TrimSpace(getenv(b.env))
		if given[b.flag] || v == "" {
			continue
		}
		if err := s.fs.Set(b.flag, v); err != nil {
			return fmt.Errorf("%s %q: %w", b.env, redact.Value(v), err)
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
