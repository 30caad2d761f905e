// Command worker relays outbox events from MongoDB to RabbitMQ.
//
//	worker [run] [flags]     relay events (the default command)
//	worker stats [--json]    counts by status, oldest NEW age, stale claims
//	worker requeue ...       move FAILED events back to NEW; retry named backing-off NEW events now
//	worker skip ...          let an aggregate's later events pass a FAILED one
//	worker show --id ID      print one event document
//
// Every setting is a flag and an environment variable; see
// docs/configuration.md. A bad setting exits with code 2 before anything
// is connected.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run dispatches to a command and turns its error into an exit code: 2 for
// a usage or configuration error, 1 for any other failure.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cmd := "run"
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || !strings.HasPrefix(args[0], "-")) {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case "run":
		err = runCommand(ctx, args, getenv, stderr)
	case "stats":
		err = statsCommand(ctx, args, getenv, stdout, stderr)
	case "requeue":
		err = requeueCommand(ctx, args, getenv, stdout, stderr)
	case "skip":
		err = skipCommand(ctx, args, getenv, stdout, stderr)
	case "show":
		err = showCommand(ctx, args, getenv, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		err = fmt.Errorf("%w: unknown command %q", ErrUsage, cmd)
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrUsage):
		fmt.Fprintf(stderr, "worker: %v\n%s", err, usageHint)
		return 2
	default:
		fmt.Fprintf(stderr, "worker: %v\n", err)
		return 1
	}
}

const usageHint = "Run 'worker help' for the commands; docs/configuration.md lists every setting.\n"

const usage = `worker relays outbox events from MongoDB to RabbitMQ.

Commands:
  run       relay events (the default)
  stats     print counts by status, the oldest NEW event's age, stale claims and held aggregates (--json)
  requeue   move FAILED events back to NEW, and make NEW events named by id that back off before a retry due now (--id ID (repeatable), --ids-from FILE|- (one id a line), --type TYPE, --all, --dry-run)
  skip      mark FAILED events skipped so that later events of their aggregates flow (--id ID (repeatable), --by NAME, --reason TEXT, --dry-run)
  show      print one event document (--id ID)

Every setting is an environment variable and a flag of the same name, e.g.
OUTBOX_MONGO_URI and --mongo-uri; see docs/configuration.md.
`
