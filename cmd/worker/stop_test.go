package main

import (
	"context"
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// An operator command whose database does not answer says so on stderr
// within a few seconds, naming the database and its limit, instead of
// looking hung; cancelled, it exits 1.
func TestCommandSaysWhatItWaitsFor(t *testing.T) {
	t.Parallel()
	uri, proxy := testenv.Proxied(t, testenv.MongoURI(t))
	proxy.Stall()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stdout, stderr testenv.LogBuffer
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, []string{"stats"}, envOf(map[string]string{"OUTBOX_MONGO_URI": uri}), nil, &stdout, &stderr)
	}()
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		return strings.Contains(stderr.String(), "waiting for MongoDB at"), "stderr: " + stderr.String()
	})
	if !strings.Contains(stderr.String(), "giving up after 1m0s") {
		t.Errorf("stderr %q does not say when the command gives up", stderr.String())
	}
	cancel()
	select {
	case c := <-code:
		if c != 1 {
			t.Errorf("exit code %d after the wait was cancelled, want 1", c)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the command did not return after its context was cancelled")
	}
}

// A stop during start-up is quick and clean: a worker whose database
// never answered, stopped by SIGINT, exits 0 well within its shutdown
// timeout, without waiting on the database to remove a heartbeat it never
// wrote.
func TestStopDuringStartUpExitsCleanly(t *testing.T) {
	t.Parallel()
	s := localStack(t)
	uri, proxy := testenv.Proxied(t, s.mongoURI)
	proxy.Stall()
	workerID := testenv.UniqueName(t, "startup-")
	env := s.workerEnv(workerID, testenv.UniqueName(t, "ex_"), workerID)
	env["OUTBOX_MONGO_URI"] = uri
	env["OUTBOX_LOG_LEVEL"] = "info"
	p := startWorker(t, workerID, env)
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		return strings.Contains(p.Tail(50), "worker starting"), "no start-up line yet"
	})
	if err := p.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	state, exited := p.Wait(shutdownTimeout)
	if !exited {
		t.Fatalf("worker still running %s after SIGINT during start-up", shutdownTimeout)
	}
	if code := state.ExitCode(); code != 0 {
		t.Errorf("worker exited with code %d after SIGINT during start-up, want 0", code)
	}
}

// SIGTERM ends the worker within OUTBOX_SHUTDOWN_TIMEOUT even when the
// database stops answering while claims are in flight: every wait of the
// stop has a deadline. What the stalled database could not record is
// recovered later; the test checks only that the stop is bounded.
func TestStopWithTheDatabaseStalled(t *testing.T) {
	t.Parallel()
	s := localStack(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	db, coll, exchange, r := s.relayed(t)
	insertBacklog(ctx, t, coll, 2000, "e2e.stalled")
	uri, proxy := testenv.Proxied(t, s.mongoURI)
	workerID := db.Name() + "-w0"
	env := s.workerEnv(db.Name(), exchange, workerID)
	env["OUTBOX_MONGO_URI"] = uri
	p := startWorker(t, workerID, env)
	r.waitDistinct(ctx, t, 1)
	proxy.Stall()
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The stop's deadline is the shutdown timeout; the process then
	// needs a moment to exit.
	state, exited := p.Wait(shutdownTimeout + 5*time.Second)
	if !exited {
		t.Fatalf("worker still running %s after SIGTERM with its database stalled (OUTBOX_SHUTDOWN_TIMEOUT %s)",
			shutdownTimeout+5*time.Second, shutdownTimeout)
	}
	if state.ExitCode() != 0 {
		checkStopErrorsNamed(t, p.LogSince(0))
	}
}

// checkStopErrorsNamed checks the "worker stopped with errors" line of a
// worker's log: each of its errors says which part of the worker failed
// to stop, or lists those the shutdown timeout left no time for, so that
// an operator is not left with a column of bare "context deadline
// exceeded".
func checkStopErrorsNamed(t *testing.T, log string) {
	t.Helper()
	for line := range strings.Lines(log) {
		var rec struct{ Msg, Error string }
		if json.Unmarshal([]byte(line), &rec) != nil || rec.Msg != "worker stopped with errors" {
			continue
		}
		for e := range strings.Lines(rec.Error) {
			if !strings.HasPrefix(e, "stop ") && !strings.HasPrefix(e, "the shutdown timeout (") {
				t.Errorf("the stop's error %q names no part of the worker; the whole error:\n%s", strings.TrimSpace(e), rec.Error)
			}
		}
		return
	}
	t.Errorf("the worker exited non-zero without a \"worker stopped with errors\" line:\n%s", log)
}
