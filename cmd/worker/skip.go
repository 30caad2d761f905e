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
	return markCommand(ctx, args, getenv, stdout, stderr, failedMark{
		verb: "skip", done: "skipped", by: "skippedBy", reason: "skipReason",
		mark:   (*mongo.Store).Skip,
		logMsg: "FAILED events skipped; later events of their aggregates flow",
	})
}

// failedMark is one of the operator's marks on FAILED events (skip,
// discard): the words its command uses and the store's write.
type failedMark struct {
	verb, done string // "skip", "skipped"
	by, reason string // the fields who and why are recorded in
	logMsg     string
	mark       func(s *mongo.Store, ctx context.Context, ids []string, by, reason string, at time.Time, dryRun bool) (int, error)
}

// markCommand runs the command of m: it marks the FAILED events named,
// records the action in the audit and logs who did what, when and why.
func markCommand(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, m failedMark) error {
	var (
		named      namedEvents
		by, reason string
	)
	ctx, cfg, store, closeFn, err := startOperator(ctx, m.verb, args, getenv, stderr, func(fs *flag.FlagSet) {
		named.define(fs, "`ID` of a FAILED event to "+m.verb+" (repeatable; commas separate ids)", m.done)
		fs.StringVar(&by, "by", "", "`NAME` of who "+m.verb+"s them (recorded as "+m.by+")")
		fs.StringVar(&reason, "reason", "", "`TEXT` saying why (recorded as "+m.reason+")")
	}, func() error {
		switch {
		case len(named.ids) == 0:
			return fmt.Errorf("%w: %s needs --id", ErrUsage, m.verb)
		case strings.TrimSpace(by) == "":
			return fmt.Errorf("%w: %s needs --by NAME (who %ss)", ErrUsage, m.verb, m.verb)
		case strings.TrimSpace(reason) == "":
			return fmt.Errorf("%w: %s needs --reason TEXT (why)", ErrUsage, m.verb)
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer closeFn()
	ids := distinct(named.ids)
	if named.dryRun {
		n, err := m.mark(store, ctx, ids, by, reason, time.Now(), true)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%d FAILED events would be %s\n", n, m.done)
		return nil
	}
	var n int
	err = auditedCLIAction(ctx, store, stderr, mongo.Action{Name: m.verb, By: by, Reason: reason, Target: targetOf(mongo.RequeueFilter{IDs: ids}), Outbox: cfg.Outbox},
		func(ctx context.Context) (int, error) {
			n, err = m.mark(store, ctx, ids, by, reason, time.Now(), false)
			return n, err
		})
	if err != nil {
		return err
	}
	newLogger(cfg, stderr).Info(m.logMsg,
		"event_ids", []string(ids), m.done, n, m.done+"_by", by, m.verb+"_reason", reason)
	fmt.Fprintf(stdout, "%s %d FAILED events (of %d named; events not FAILED or already %s are left alone)\n", m.done, n, len(ids), m.done)
	return nil
}
