package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/outboxrelay/outbox/internal/buildinfo"
)

// versionCommand is `worker version` (and `worker --version`): the
// version, the VCS revision, the build date, the Go version and the
// platform of this build, with nothing connected and no setting read.
func versionCommand(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	asJSON := fs.Bool("json", false, "print JSON: version, revision, buildDate, goVersion, goos, goarch")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return &helpRequest{text: commandUsage("version", fs, nil)}
		}
		return fmt.Errorf("%w: version: %v", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: version: unexpected argument %q", ErrUsage, fs.Arg(0))
	}
	info := buildinfo.Read()
	if *asJSON {
		return json.NewEncoder(stdout).Encode(info)
	}
	_, err := fmt.Fprintln(stdout, info)
	return err
}

// connectionName names this replica's connections to the database (the
// appName of its handshake, seen in db.currentOp() and the server's log)
// and to the broker (the connection name in RabbitMQ's management UI):
// the program, the worker id and the version, so that an operator finds
// a replica, and tells the two versions of a rolling upgrade apart.
// MongoDB takes at most 128 bytes of appName; a longer worker id is cut.
func connectionName(program, workerID string) string {
	const appNameMax = 128
	v := buildinfo.Read().Short()
	name := program + " " + v
	if workerID != "" {
		name = program + " " + workerID + " " + v
	}
	if len(name) > appNameMax {
		cut := appNameMax - len(program) - len(v) - 2
		name = program + " " + workerID[:max(cut, 0)] + " " + v
	}
	return name
}
