package main

// run with bad settings and with --help: the exit status, and that nothing
// listens or connects before the settings are known good.

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// countingListener accepts connections and counts them, holding them open
// without answering.
type countingListener struct {
	ln       net.Listener
	accepted atomic.Int64
}

func listenCounting(t *testing.T) *countingListener {
	t.Helper()
	ln, err := new(net.ListenConfig).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &countingListener{ln: ln}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				_ = c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			l.accepted.Add(1)
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
	})
	return l
}

func (l *countingListener) addr() string { return l.ln.Addr().String() }

// runResult is what run returned and printed.
type runResult struct {
	code           int
	stdout, stderr string
}

// runBounded calls run and fails the test if it has not returned within
// a generous bound: a worker that got past its configuration would relay
// until its context ends.
func runBounded(t *testing.T, args []string, env map[string]string) runResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, envOf(env), environOf(env), &stdout, &stderr) }()
	select {
	case code := <-done:
		return runResult{code: code, stdout: stdout.String(), stderr: stderr.String()}
	case <-ctx.Done():
		code := <-done // run returns once its context has ended
		t.Fatalf("run(%q) did not return before its context ended (code %d); stderr:\n%s", args, code, stderr.String())
		return runResult{}
	}
}

// TestRunBadSettingExitsTwo checks that a bad setting stops every command
// with exit code 2 and a message naming the variable, before anything is
// connected: both URIs point at listeners that count connections.
func TestRunBadSettingExitsTwo(t *testing.T) {
	t.Parallel()
	mongoLn, amqpLn := listenCounting(t), listenCounting(t)
	base := map[string]string{
		"OUTBOX_MONGO_URI": "mongodb://relay:secret@" + mongoLn.addr() + "/?serverSelectionTimeoutMS=60000",
		"OUTBOX_AMQP_URL":  "amqp://relay:secret@" + amqpLn.addr() + "/",
		"OUTBOX_HTTP_ADDR": "127.0.0.1:0",
	}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string // in stderr
	}{
		{name: "run batch size", env: map[string]string{"OUTBOX_BATCH_SIZE": "abc"}, want: "OUTBOX_BATCH_SIZE"},
		{name: "run is the default command", args: []string{"--batch-size=0"}, want: "OUTBOX_BATCH_SIZE"},
		{name: "run stale after", args: []string{"run"}, env: map[string]string{"OUTBOX_STALE_AFTER": "soon"}, want: "OUTBOX_STALE_AFTER"},
		{name: "run stale below publish timeout", args: []string{"run"},
			env: map[string]string{"OUTBOX_STALE_AFTER": "11s", "OUTBOX_PUBLISH_TIMEOUT": "9s"}, want: "OUTBOX_STALE_AFTER"},
		{name: "run claim schedule", args: []string{"run"}, env: map[string]string{"OUTBOX_CLAIM_SCHEDULE": "every second"}, want: "OUTBOX_CLAIM_SCHEDULE"},
		{name: "run http addr", args: []string{"run"}, env: map[string]string{"OUTBOX_HTTP_ADDR": "8080"}, want: "OUTBOX_HTTP_ADDR"},
		{name: "run log level", args: []string{"run"}, env: map[string]string{"OUTBOX_LOG_LEVEL": "loud"}, want: "OUTBOX_LOG_LEVEL"},
		{name: "run amqp url without host", args: []string{"run"}, env: map[string]string{"OUTBOX_AMQP_URL": "amqp://user:secret@"}, want: "OUTBOX_AMQP_URL"},
		{name: "run mongo uri the driver rejects", args: []string{"run"},
			env: map[string]string{"OUTBOX_MONGO_URI": "mongodb://user:secret@" + mongoLn.addr() + "/?connectTimeoutMS=soon"}, want: "OUTBOX_MONGO_URI"},
		{name: "stats mongo uri", args: []string{"stats", "--json"}, env: map[string]string{"OUTBOX_MONGO_URI": "http://x"}, want: "OUTBOX_MONGO_URI"},
		{name: "requeue without a filter", args: []string{"requeue"}, want: "--id, --ids-from, --type or --all"},
		{name: "requeue log level", args: []string{"requeue", "--all"}, env: map[string]string{"OUTBOX_LOG_LEVEL": "loud"}, want: "OUTBOX_LOG_LEVEL"},
		{name: "show without id", args: []string{"show"}, want: "--id"},
		{name: "show mongo uri", args: []string{"show", "--id", "x"}, env: map[string]string{"OUTBOX_MONGO_URI": "mongodb://"}, want: "OUTBOX_MONGO_URI"},
		{name: "unknown command", args: []string{"relay"}, want: `"relay"`},
		{name: "command after flags", args: []string{"--batch-size", "100", "stats"}, want: `"stats"`},
		{name: "stats extra argument", args: []string{"stats", "now"}, want: `"now"`},
		{name: "run traces exporter", args: []string{"run"}, env: map[string]string{"OTEL_TRACES_EXPORTER": "console"}, want: `invalid OTEL_TRACES_EXPORTER "console"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{}
			for k, v := range base {
				env[k] = v
			}
			for k, v := range tt.env {
				env[k] = v
			}
			got := runBounded(t, tt.args, env)
			if got.code != 2 {
				t.Errorf("run(%q) = %d, want 2; stderr:\n%s", tt.args, got.code, got.stderr)
			}
			if !strings.Contains(got.stderr, tt.want) {
				t.Errorf("stderr does not mention %q:\n%s", tt.want, got.stderr)
			}
			if strings.Contains(got.stderr, "secret") {
				t.Errorf("stderr leaks the password:\n%s", got.stderr)
			}
			if got.stdout != "" {
				t.Errorf("stdout = %q, want nothing", got.stdout)
			}
		})
	}
	// Subtests run in parallel: this cleanup runs after all of them.
	t.Cleanup(func() {
		if n := mongoLn.accepted.Load(); n != 0 {
			t.Errorf("%d connections to the MongoDB address, want none", n)
		}
		if n := amqpLn.accepted.Load(); n != 0 {
			t.Errorf("%d connections to the RabbitMQ address, want none", n)
		}
	})
}

func TestRunHelp(t *testing.T) {
	t.Parallel()
	for _, arg := range []string{"help", "-h", "--help"} {
		got := runBounded(t, []string{arg}, nil)
		if got.code != 0 {
			t.Errorf("run(%q) = %d, want 0; stderr:\n%s", arg, got.code, got.stderr)
		}
		for _, cmd := range []string{"run", "stats", "requeue", "show"} {
			if !strings.Contains(got.stdout, "  "+cmd+" ") {
				t.Errorf("run(%q) output does not list command %q:\n%s", arg, cmd, got.stdout)
			}
		}
	}
}
