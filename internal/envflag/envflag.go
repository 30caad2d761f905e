// Package envflag reads the settings of the demo commands (producer,
// consumer): a flag, else its environment variable, else the flag's
// default. The worker has its own, richer, settings table in cmd/worker.
package envflag

import (
	"flag"
	"fmt"
	"strings"

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
