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

// discardCommand is `worker discard`: it marks FAILED events discarded,
// a skip that no requeue undoes, for an event an operator decided is
// never to be published. The events are kept, with who, when and why;
// the action is recorded in the audit and logged.
func discardCommand(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var (
		named      namedEvents
		by, reason string
	)
	ctx, cfg, store, closeFn, err := startOperator(ctx, "discard", args, getenv, stderr, func(fs *flag.FlagSet) {
		named.define(fs, "`ID` of a FAILED event to discard (repeatable; commas separate ids)", "discarded")
		fs.StringVar(&by, "by", "", "`NAME` of who discards them (recorded as discardedBy)")
		fs.StringVar(&reason, "reason", "", "`TEXT` saying why (recorded as discardReason)")
	}, func() error {
		switch {
		case len(named.ids) == 0:
			return fmt.Errorf("%w: discard needs --id", ErrUsage)
		case strings.TrimSpace(by) == "":
			return fmt.Errorf("%w: discard needs --by NAME (who discards)", ErrUsage)
		case strings.TrimSpace(reason) == "":
			return fmt.Errorf("%w: discard needs --reason TEXT (why)", ErrUsage)
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer closeFn()
	ids := distinct(named.ids)
	if named.dryRun {
		n, err := store.Discard(ctx, ids, by, reason, time.Now(), true)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%d FAILED events would be discarded\n", n)
		return nil
	}
	var n int
	err = auditedCLIAction(ctx, store, stderr, mongo.Action{Name: "discard", By: by, Reason: reason, Target: targetOf(mongo.RequeueFilter{IDs: ids})},
		func(ctx context.Context) (int, error) {
			n, err = store.Discard(ctx, ids, by, reason, time.Now(), false)
			return n, err
		})
	if err != nil {
		return err
	}
	newLogger(cfg, stderr).Info("FAILED events discarded; they are kept, never requeued, and later events of their aggregates flow",
		"event_ids", []string(ids), "discarded", n, "discarded_by", by, "discard_reason", reason)
	fmt.Fprintf(stdout, "discarded %d FAILED events (of %d named; events not FAILED or already discarded are left alone)\n", n, len(ids))
	return nil
}
