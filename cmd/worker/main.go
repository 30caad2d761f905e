// Command worker relays outbox events from MongoDB to RabbitMQ.
//
//	worker [run] [flags]     relay events (the default command)
//	worker setup             create or upgrade the collections and indexes
//	worker stats [--json]    counts by status, oldest NEW age, stale claims
//	worker requeue ...       move FAILED events back to NEW; retry named backing-off NEW events now
//	worker skip ...          let an aggregate's later events pass a FAILED one
//	worker discard ...       never publish a FAILED event; kept, skipped, not requeued
//	worker pause TYPE ...    stop relaying an event type; resume TYPE relays it again
//	worker show --id ID      print one event document
//	worker console           serve the operator console (read-only)
//	worker version           print the version, VCS revision and Go version
//	worker help [command]    list the commands, or a command's flags
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
	code := run(ctx, os.Args[1:], os.Getenv, os.Environ(), os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run dispatches to a command and turns its error into an exit code: 0
// for help asked for, 2 for a usage or configuration error, 1 for any
// other failure. environ is the whole environment (KEY=value), which the
// relay checks for OUTBOX_ variables it does not know.
func run(ctx context.Context, args []string, getenv func(string) string, environ []string, stdout, stderr io.Writer) int {
	cmd := "run"
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "--version" || !strings.HasPrefix(args[0], "-")) {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case "run":
		err = runCommand(ctx, args, getenv, environ, stderr)
	case "stats":
		err = statsCommand(ctx, args, getenv, stdout, stderr)
	case "requeue":
		err = requeueCommand(ctx, args, getenv, stdout, stderr)
	case "skip":
		err = skipCommand(ctx, args, getenv, stdout, stderr)
	case "discard":
		err = discardCommand(ctx, args, getenv, stdout, stderr)
	case "show":
		err = showCommand(ctx, args, getenv, stdout, stderr)
	case "pause", "resume":
		err = pauseCommand(ctx, cmd, args, getenv, stdout, stderr)
	case "console":
		err = consoleCommand(ctx, args, getenv, stderr)
	case "setup":
		err = setupCommand(ctx, args, getenv, stdout, stderr)
	case "version", "--version":
		err = versionCommand(args, stdout)
	case "help", "-h", "--help":
		if len(args) > 0 && args[0] != "help" && !strings.HasPrefix(args[0], "-") {
			// `worker help stats` is `worker stats --help`.
			return run(ctx, []string{args[0], "--help"}, getenv, environ, stdout, stderr)
		}
		fmt.Fprint(stdout, usage())
		return 0
	default:
		err = fmt.Errorf("%w: unknown command %q%s", ErrUsage, cmd, didYouMean(cmd, commandNames(), "%s"))
	}
	var help *helpRequest
	switch {
	case err == nil:
		return 0
	case errors.As(err, &help):
		fmt.Fprint(stdout, help.text)
		return 0
	case errors.Is(err, ErrUsage):
		fmt.Fprintf(stderr, "worker: %v\n%s", err, usageHint)
		return 2
	default:
		fmt.Fprintf(stderr, "worker: %v\n", err)
		return 1
	}
}

const usageHint = "Run 'worker help' for the commands, 'worker <command> --help' for a command's flags; docs/configuration.md lists every setting.\n"
