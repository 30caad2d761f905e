package main

import (
	"fmt"
	"strconv"

	"github.com/outboxrelay/outbox/console"
)

// ConsoleConfig is what `worker console` reads besides the operator
// commands' settings.
type ConsoleConfig struct {
	// ConsoleAddr is where it listens; ConsoleWrites turns its actions
	// on, behind ConsoleToken; ConsoleRequeueRate spreads a group's
	// requeue; ConsoleActionMax bounds the events of one action.
	ConsoleAddr        string
	ConsoleWrites      bool
	ConsoleToken       string
	ConsoleRequeueRate int
	ConsoleActionMax   int
}

// consoleSettings are the settings of ConsoleConfig.
func consoleSettings() []setting {
	return []setting{
		{env: "OUTBOX_CONSOLE_ADDR", flag: "console-addr", def: "127.0.0.1:8090", forConsole: true,
			usage: "address the console command serves the operator console on; it is read-only and has no authentication of its own, so keep it on loopback or behind a proxy that authenticates",
			parse: func(c *Config, v string) error { return parseAddr(&c.ConsoleAddr, v) }},
		{env: "OUTBOX_CONSOLE_WRITES", flag: "console-writes", def: "false", forConsole: true,
			usage: "true turns the console's actions on (requeue, skip, requeue of a failure group, pause and resume of an event type, each with a reason and audited); it then needs OUTBOX_CONSOLE_TOKEN",
			parse: func(c *Config, v string) error { return parseBool(&c.ConsoleWrites, v) }},
		{env: "OUTBOX_CONSOLE_TOKEN", flag: "console-token", def: "", forConsole: true, secret: true,
			usage: "password every console request gives by HTTP Basic authentication (the user name is recorded as who acted) while the actions are on. Prefer the variable: a flag shows in ps",
			parse: parseConsoleToken},
		{env: "OUTBOX_CONSOLE_REQUEUE_RATE", flag: "console-requeue-rate", def: strconv.Itoa(console.RequeuePerSecondDefault), forConsole: true,
			usage: "events a second a failure group's requeue from the console makes due, oldest first, so that the relay and its consumers are not flooded",
			parse: func(c *Config, v string) error { return parseIntBetween(&c.ConsoleRequeueRate, v, 1, 100000) }},
		{env: "OUTBOX_CONSOLE_ACTION_MAX", flag: "console-action-max", def: strconv.Itoa(console.ActionMaxDefault), forConsole: true,
			usage: "most events one console action touches: a preview selects the oldest so many, and the rest wait for another action",
			parse: func(c *Config, v string) error {
				return parseIntBetween(&c.ConsoleActionMax, v, 1, console.ActionMaxLimit)
			}},
	}
}

// parseConsoleToken accepts no token, or one long enough; the error
// never shows it.
func parseConsoleToken(c *Config, v string) error {
	if v != "" && len(v) < console.TokenMinLength {
		return fmt.Errorf("want at least %d characters (got %d)", console.TokenMinLength, len(v))
	}
	c.ConsoleToken = v
	return nil
}
