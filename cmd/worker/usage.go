package main

import (
	"flag"
	"fmt"
	"slices"
	"strings"
)

// commandInfo is a command's name and what it does, for `worker help` and
// `worker <command> --help`.
type commandInfo struct{ name, summary string }

// commands are the worker's commands in the order help lists them.
var commands = []commandInfo{
	{"run", "relay events (the default command)"},
	{"setup", "create what is missing of the outbox's collections and indexes, and say what it did (idempotent; run it before starting a new version)"},
	{"stats", "print counts by status, the oldest NEW event's age, stale claims and held aggregates"},
	{"requeue", "move FAILED events back to NEW, and make NEW events named by id that back off before a retry due now"},
	{"skip", "mark FAILED events skipped so that later events of their aggregates flow"},
	{"discard", "mark FAILED events discarded: kept, skipped, and never requeued"},
	{"show", "print one event document with its history fields"},
	{"pause", "stop relaying the events of a type: they stay NEW and, with ordering, hold their aggregates (worker pause TYPE --reason TEXT)"},
	{"resume", "relay the events of a paused type again (worker resume TYPE --reason TEXT)"},
	{"console", "serve the operator console on OUTBOX_CONSOLE_ADDR, of every outbox of OUTBOX_FLEET_FILE or the one --outbox names (needs MongoDB only)"},
	{"version", "print the version, the VCS revision and the Go version of this build (also --version)"},
	{"help", "list the commands, or with a command's name, its flags"},
}

func commandNames() []string {
	names := make([]string, len(commands))
	for i, c := range commands {
		names[i] = c.name
	}
	return names
}

// usage is what `worker help`, `worker --help` and `worker -h` print.
func usage() string {
	var b strings.Builder
	b.WriteString("worker relays outbox events from MongoDB to RabbitMQ.\n\nUsage: worker [command] [flags]\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-9s %s\n", c.name, c.summary)
	}
	b.WriteString(`
Run 'worker <command> --help' for a command's flags, with their defaults.
Every setting is an environment variable and a flag of the same name, e.g.
OUTBOX_MONGO_URI and --mongo-uri; see docs/configuration.md.
`)
	return b.String()
}

// helpRequest is the outcome of -h or --help after a command: not an
// error, but the command's usage, which run prints on stdout before it
// exits 0.
type helpRequest struct{ text string }

func (h *helpRequest) Error() string { return "help requested" }

// commandUsage lists the flags of command name: its own first (fs's flags
// that are no setting), then the settings it reads, each with its
// variable and default.
func commandUsage(name string, fs *flag.FlagSet, settings []setting) string {
	var b strings.Builder
	fmt.Fprintf(&b, "usage: worker %s [flags]\n", name)
	if i := slices.IndexFunc(commands, func(c commandInfo) bool { return c.name == name }); i >= 0 {
		fmt.Fprintf(&b, "\n%s\n", commands[i].summary)
	}
	isSetting := map[string]bool{}
	for _, s := range settings {
		isSetting[s.flag] = true
	}
	var own []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) {
		if !isSetting[f.Name] {
			own = append(own, f)
		}
	})
	if len(own) > 0 {
		fmt.Fprintf(&b, "\nFlags of %s:\n", name)
		for _, f := range own {
			kind, text := flag.UnquoteUsage(f)
			head := "  --" + f.Name
			if kind != "" && kind != "value" {
				head += " " + kind
			} else if kind == "value" {
				head += " VALUE"
			}
			fmt.Fprintf(&b, "%s\n        %s", head, text)
			if f.DefValue != "" && f.DefValue != "false" {
				fmt.Fprintf(&b, " (default %s)", f.DefValue)
			}
			b.WriteString("\n")
		}
	}
	if len(settings) == 0 {
		return b.String() // worker version reads none
	}
	b.WriteString("\nSettings (a flag wins over its environment variable, which wins over the default):\n")
	for _, s := range settings {
		def := redactSetting(s.def)
		if s.env == "OUTBOX_WORKER_ID" {
			def = "<hostname>-<pid>" // this process's would mislead: each worker has its own
		}
		fmt.Fprintf(&b, "  --%s (%s, default %s)\n        %s\n", s.flag, s.env, def, s.usage)
	}
	if name == "run" {
		b.WriteString("\nTracing is off unless OTEL_TRACES_EXPORTER=otlp; the OTEL_* variables (endpoint, protocol,\n" +
			"headers, sampler, service name, resource attributes) are read from the environment only:\n" +
			"see docs/tracing.md.\n")
	}
	b.WriteString("\ndocs/configuration.md describes every setting.\n")
	return b.String()
}
