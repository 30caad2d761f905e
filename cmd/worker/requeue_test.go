package main

import (
	"errors"
	"os"
	"strings"
	"testing"

	"golang.org/x/term"

	"github.com/outboxrelay/outbox/mongo"
)

// TestTerminalConfirm: only a deliberate yes confirms; an empty line, the
// end of the input and anything else do not.
func TestTerminalConfirm(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		answer string
		want   error
	}{
		{"y\n", nil},
		{"Y\n", nil},
		{"yes\n", nil},
		{" YES \r\n", nil},
		{"yes", nil}, // no newline before the end of the input
		{"\n", errNotConfirmed},
		{"", errNotConfirmed},
		{"n\n", errNotConfirmed},
		{"no\n", errNotConfirmed},
		{"yess\n", errNotConfirmed},
		{"sure\n", errNotConfirmed},
	} {
		var prompt strings.Builder
		c := terminal{in: strings.NewReader(tt.answer), prompt: &prompt, terminal: true}
		if err := c.confirm("Requeue all 3 FAILED events to NEW?"); !errors.Is(err, tt.want) {
			t.Errorf("answer %q: confirm = %v, want %v", tt.answer, err, tt.want)
		}
		if want := "Requeue all 3 FAILED events to NEW? [y/N] "; prompt.String() != want {
			t.Errorf("answer %q: prompt %q, want %q", tt.answer, prompt.String(), want)
		}
	}
}

// TestRequeueAllNeedsYesOffATerminal: `requeue --all` with standard input
// not a terminal (a script, a pipe, a CI job) stops with exit code 2 and a
// message naming --yes, before it connects to anything.
func TestRequeueAllNeedsYesOffATerminal(t *testing.T) {
	t.Parallel()
	if term.IsTerminal(int(os.Stdin.Fd())) {
		t.Skip("standard input is a terminal here; go test gives tests none")
	}
	mongoLn := listenCounting(t)
	env := map[string]string{"OUTBOX_MONGO_URI": "mongodb://" + mongoLn.addr() + "/?serverSelectionTimeoutMS=500"}
	for _, args := range [][]string{
		{"requeue", "--all"},
		{"requeue", "--all", "--yes=false"},
	} {
		got := runBounded(t, args, env)
		if got.code != 2 {
			t.Errorf("run(%q) = %d, want 2; stderr:\n%s", args, got.code, got.stderr)
		}
		if !strings.Contains(got.stderr, "--yes") || !strings.Contains(got.stderr, "not a terminal") {
			t.Errorf("run(%q): stderr does not say that --yes is needed off a terminal:\n%s", args, got.stderr)
		}
	}
	if n := mongoLn.accepted.Load(); n != 0 {
		t.Errorf("requeue --all without --yes connected to MongoDB %d times, want none", n)
	}
}

func TestEveryFailed(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		f    mongo.RequeueFilter
		want bool
	}{
		{mongo.RequeueFilter{All: true}, true},
		{mongo.RequeueFilter{All: true, Type: "order.created"}, false},
		{mongo.RequeueFilter{All: true, IDs: []string{"e1"}}, false},
		{mongo.RequeueFilter{Type: "order.created"}, false},
	} {
		if got := everyFailed(tt.f); got != tt.want {
			t.Errorf("everyFailed(%+v) = %t, want %t", tt.f, got, tt.want)
		}
	}
}
