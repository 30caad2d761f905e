package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/outboxrelay/outbox/mongo"
)

// skipCommand is `worker skip`: it marks FAILED events as skipped by an
// operator, so that the later events of their aggregates flow, and
// records and logs who skipped what, when and why.
func skipCommand(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var (
		named      namedEvents
		by, reason string
	)
	ctx, cfg, store, closeFn, err := startOperator(ctx, "skip", args, getenv, stderr, func(fs *flag.FlagSet) {
		named.define(fs, "`ID` of a FAILED event to skip (repeatable; commas separate ids)", "skipped")
		fs.StringVar(&by, "by", "", "`NAME` of who skips them (recorded as skippedBy)")
		fs.StringVar(&reason, "reason", "", "`TEXT` saying why (recorded as skipReason)")
	}, func() error {
		switch {
		case len(named.ids) == 0:
			return fmt.Errorf("%w: skip needs --id", ErrUsage)
		case strings.TrimSpace(by) == "":
			return fmt.Errorf("%w: skip needs --by NAME (who skips)", ErrUsage)
		case strings.TrimSpace(reason) == "":
			return fmt.Errorf("%w: skip needs --reason TEXT (why)", ErrUsage)
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer closeFn()
	ids, dryRun := distinct(named.ids), named.dryRun
	if dryRun {
		n, err := store.Skip(ctx, ids, by, reason, time.Now(), true)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%d FAILED events would be skipped\n", n)
		return nil
	}
	var n int
	err = auditedCLIAction(ctx, store, stderr, mongo.Action{Name: "skip", By: by, Reason: reason, Target: targetOf(mongo.RequeueFilter{IDs: ids})},
		func(ctx context.Context) (int, error) {
			n, err = store.Skip(ctx, ids, by, reason, time.Now(), false)
			return n, err
		})
	if err != nil {
		return err
	}
	newLogger(cfg, stderr).Info("FAILED events skipped; later events of their aggregates flow",
		"event_ids", []string(ids), "skipped", n, "skipped_by", by, "skip_reason", reason)
	fmt.Fprintf(stdout, "skipped %d FAILED events (of %d named; events not FAILED or already skipped are left alone)\n", n, len(ids))
	return nil
}
