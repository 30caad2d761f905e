package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"

	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/fleet"
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
// With a fleet file and no --outbox it sets up every outbox of the file,
// those of a pattern of databases in each database that matches now
// (setupFleet).
func setupCommand(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var console bool
	var flags *flag.FlagSet
	cfg, _, err := loadConfig("setup", args, getenv, setupKind, func(fs *flag.FlagSet) {
		flags = fs
		fs.BoolVar(&console, "console", false, "also create the index of the console's event lists (outbox_browse), which every status write then maintains")
	})
	if err != nil {
		return err
	}
	if cfg.FleetFile != "" && flags.Lookup("outbox").Value.String() == "" {
		return setupFleet(ctx, cfg, console, stdout, stderr)
	}
	return setupOutbox(ctx, cfg, console, stdout, stderr)
}

// setupOutbox sets up the one outbox cfg describes.
func setupOutbox(ctx context.Context, cfg Config, console bool, stdout, stderr io.Writer) error {
	ctx, store, closeFn, err := openStore(ctx, cfg, stderr)
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

// setupFleet sets up every outbox of the fleet file: each entry of one
// database, and for each entry of a pattern, the outbox of each database
// that matches now (a database created later is set up by the relay
// with OUTBOX_SETUP=auto, or by running setup again). Each outbox's lines
// follow its name; one that fails does not keep the others from being
// set up, and the command fails naming it.
func setupFleet(ctx context.Context, cfg Config, console bool, stdout, stderr io.Writer) error {
	entries, err := fleet.Load(cfg.FleetFile)
	if err != nil {
		return fmt.Errorf("%w: OUTBOX_FLEET_FILE %s", ErrUsage, err)
	}
	chosen := operatorSettings()
	var errs []error
	for _, e := range entries {
		c := cfg
		if err := applyEntry(&c, e, chosen); err != nil {
			return err
		}
		targets := []outboxConfig{{Name: e.Name, Config: c}}
		if e.Databases != "" {
			if targets, err = discoverForSetup(ctx, c, e, stdout, stderr); err != nil {
				errs = append(errs, fmt.Errorf("outbox %s: %w", e.Name, err))
				continue
			}
		}
		for _, t := range targets {
			fmt.Fprintf(stdout, "outbox %s (%s.%s):\n", t.Name, t.MongoDatabase, t.MongoCollection)
			if err := setupOutbox(ctx, t.Config, console, stdout, stderr); err != nil {
				errs = append(errs, fmt.Errorf("outbox %s: %w", t.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// discoverForSetup lists the databases of the entry e's cluster (its
// settings in c) and returns the outbox of each that matches e's
// pattern, saying of each that cannot name an outbox that it is skipped.
func discoverForSetup(ctx context.Context, c Config, e fleet.Outbox, stdout, stderr io.Writer) ([]outboxConfig, error) {
	ctx, store, closeFn, err := openStore(ctx, c, stderr)
	if err != nil {
		return nil, err
	}
	defer closeFn()
	dbs, err := store.Collection().Database().Client().ListDatabaseNames(ctx, listFilter(e.Databases), options.ListDatabases().SetAuthorizedDatabases(true))
	if err != nil {
		return nil, fmt.Errorf("list databases: %w", err)
	}
	var out []outboxConfig
	for _, db := range dbs {
		if !fleet.Matches(e.Databases, db) {
			continue
		}
		name, err := fleet.DiscoveredName(e.Name, db)
		if err != nil {
			fmt.Fprintf(stdout, "skipped database %s: %v\n", db, err)
			continue
		}
		t := c
		t.MongoDatabase = db
		out = append(out, outboxConfig{Name: name, Config: t})
	}
	if len(out) == 0 {
		fmt.Fprintf(stdout, "outbox %s: no database matches %q yet\n", e.Name, e.Databases)
	}
	return out, nil
}

// operatorSettings are the settings the operator commands read.
func operatorSettings() []setting {
	return slices.DeleteFunc(settings(), func(s setting) bool { return !s.forOperatorCommands })
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
