package main

import (
	"context"
	"flag"
	"fmt"
	"io"
)

// Values of OUTBOX_SETUP.
const (
	// setupAuto: run creates what it needs and does not find, and logs
	// what it created, as every version before worker setup did.
	setupAuto = "auto"
	// setupCheck: run creates nothing; it stops, naming what is missing
	// and the command to run (worker setup).
	setupCheck = "check"
)

// setupCommand is `worker setup`: it creates what is missing of the
// outbox's collections and indexes (and, where the deployment has
// transactions, the fence documents), says what it did, and is safe to
// run again and from several places at once. It is the step a release's
// upgrade notes name before the rollout, run as a user that may create
// collections and indexes; the relay can then run as one that may not.
func setupCommand(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var console bool
	ctx, cfg, store, closeFn, err := startOperator(ctx, "setup", args, getenv, stderr, func(fs *flag.FlagSet) {
		fs.BoolVar(&console, "console", false, "also create the index of the console's event lists (outbox_browse), which every status write then maintains")
	}, nil)
	if err != nil {
		return err
	}
	defer closeFn()
	done, err := store.Setup(ctx)
	for _, line := range done {
		fmt.Fprintln(stdout, line)
	}
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	if console {
		had, err := store.HasBrowseIndex(ctx)
		if err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		if !had {
			if err := store.EnsureBrowseIndex(ctx); err != nil {
				return fmt.Errorf("setup: %w", err)
			}
			fmt.Fprintln(stdout, "created the console's index outbox_browse")
			done = append(done, "outbox_browse")
		}
	}
	if len(done) == 0 {
		fmt.Fprintf(stdout, "nothing to do: every collection and index of %s.%s is in place\n", cfg.MongoDatabase, cfg.MongoCollection)
	}
	return nil
}

// prepareSchema readies the database for the relay (mongo.PrepareRun):
// with OUTBOX_SETUP=auto it creates what is missing and logs each thing
// it created; with check it stops naming what is missing.
func (o *relayedOutbox) prepareSchema(ctx context.Context) error {
	done, err := o.store.PrepareRun(ctx, o.cfg.Setup == setupAuto)
	for _, line := range done {
		o.logger.Info(line+" (OUTBOX_SETUP=auto; worker setup does this as a step of its own)", "setup", o.cfg.Setup)
	}
	return err
}
