package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

// pauseCommand is `worker pause TYPE` and, with resume, `worker resume
// TYPE`: the relay stops claiming the events of a type (they stay NEW,
// and with ordering hold their aggregates), or claims them again. Both
// say who and why, and are recorded in the audit collection.
func pauseCommand(ctx context.Context, name string, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	resume := name == "resume"
	var typ, typeFlag, by, reason string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		typ, args = args[0], args[1:]
	}
	ctx, cfg, store, closeFn, err := startOperator(ctx, name, args, getenv, stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&typeFlag, "type", "", "the event `TYPE` to "+name+" (or give it as the first argument)")
		fs.StringVar(&by, "by", "", "`NAME` of who does it, for the audit record (default: the user running the command)")
		fs.StringVar(&reason, "reason", "", "`TEXT` saying why, for the audit record (required)")
	}, func() error {
		switch {
		case typ != "" && typeFlag != "" && typ != typeFlag:
			return fmt.Errorf("%w: %s: two types given, %q and --type %q; %s takes one", ErrUsage, name, typ, typeFlag, name)
		case typ == "" && typeFlag == "":
			return fmt.Errorf("%w: %s needs an event type: worker %s TYPE --reason TEXT", ErrUsage, name, name)
		case strings.TrimSpace(reason) == "":
			return fmt.Errorf("%w: %s needs --reason TEXT (why, for the audit record)", ErrUsage, name)
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer closeFn()
	typ = cmp.Or(typ, typeFlag)
	by = cmp.Or(strings.TrimSpace(by), whoRuns())
	var changed bool
	if resume {
		changed, err = store.Resume(ctx, typ)
	} else {
		changed, err = store.Pause(ctx, events.Pause{Type: typ, By: by, Reason: reason, At: serverNow(ctx, store)})
	}
	if err != nil {
		return err
	}
	switch {
	case !changed && resume:
		fmt.Fprintf(stdout, "type %s was not paused: nothing changed\n", typ)
		return nil
	case !changed:
		fmt.Fprintf(stdout, "type %s was already paused: nothing changed (worker stats lists who paused it and why)\n", typ)
		return nil
	case resume:
		newLogger(cfg, stderr).Info("event type resumed; the relay claims its events again", "type", typ, "by", by, "reason", reason)
		fmt.Fprintf(stdout, "resumed type %s: each replica claims its events again within %s\n", typ, mongo.PausedTypesMaxAge)
	default:
		newLogger(cfg, stderr).Info("event type paused; its events stay NEW and hold their aggregates", "type", typ, "by", by, "reason", reason)
		fmt.Fprintf(stdout, "paused type %s: each replica stops claiming its events within %s (a batch already claimed is still published)\n", typ, mongo.PausedTypesMaxAge)
	}
	return recordCLIAction(ctx, store, stderr, mongo.Action{Name: name, By: by, Reason: reason, Target: "type: " + typ, Count: 1, Outbox: cfg.Outbox})
}

// whoRuns is the user running a command, who an audit record names when
// the command's --by does not.
func whoRuns() string { return cmp.Or(os.Getenv("USER"), os.Getenv("LOGNAME"), "unknown") }
