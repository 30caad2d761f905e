package workerproc

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// startShell runs script under /bin/sh as a worker would run.
func startShell(t *testing.T, script string) *Proc {
	t.Helper()
	p, err := Start(Config{Bin: "/bin/sh", Name: "sh", Args: []string{"-c", script}, LogPath: filepath.Join(t.TempDir(), "sh.log")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

func TestStopCleanExit(t *testing.T) {
	t.Parallel()
	// The shell runs sleep in the background and waits, so that SIGTERM
	// reaches the trap at once.
	p := startShell(t, `trap 'echo stopping; exit 0' TERM; echo started; while :; do sleep 0.05 & wait; done`)
	waitForLog(t, p, "started")
	state, err := p.Stop(10 * time.Second)
	if err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if state.ExitCode() != 0 {
		t.Errorf("exit code %d, want 0", state.ExitCode())
	}
	if got := p.Tail(1); got != "stopping" {
		t.Errorf("Tail(1) = %q, want %q", got, "stopping")
	}
	if err := p.Signal(syscall.SIGTERM); err == nil {
		t.Error("Signal after the exit: no error")
	}
}

func TestStopReportsExitCodeAndKillsTheStuck(t *testing.T) {
	t.Parallel()
	failing := startShell(t, `trap 'exit 3' TERM; echo started; while :; do sleep 0.05 & wait; done`)
	waitForLog(t, failing, "started")
	if state, err := failing.Stop(10 * time.Second); err == nil || state == nil || state.ExitCode() != 3 {
		t.Errorf("Stop of a process exiting 3: state %v, error %v; want code 3 and an error", state, err)
	}
	stuck := startShell(t, `trap '' TERM; echo started; while :; do sleep 0.05; done`)
	waitForLog(t, stuck, "started")
	state, err := stuck.Stop(200 * time.Millisecond)
	if err == nil || state != nil {
		t.Errorf("Stop of a process ignoring SIGTERM: state %v, error %v; want nil and an error", state, err)
	}
	select {
	case <-stuck.Done():
	default:
		t.Error("the stuck process still runs after Stop")
	}
}

func TestEnvironDropsOutboxVariables(t *testing.T) {
	t.Setenv("OUTBOX_FROM_THE_SHELL", "x")
	env := Environ(map[string]string{"OUTBOX_B": "2", "OUTBOX_A": "1"})
	if slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "OUTBOX_FROM_THE_SHELL=") }) {
		t.Error("Environ kept an OUTBOX_ variable of this process")
	}
	if got := env[len(env)-2:]; !slices.Equal(got, []string{"OUTBOX_A=1", "OUTBOX_B=2"}) {
		t.Errorf("Environ ends with %v, want OUTBOX_A=1 then OUTBOX_B=2", got)
	}
}

// waitForLog waits until the process's log holds line.
func waitForLog(t *testing.T, p *Proc, line string) {
	t.Helper()
	testenv.Eventually(t, testenv.WaitTimeout, func() (bool, string) {
		b, err := os.ReadFile(p.LogPath())
		return strings.Contains(string(b), line+"\n"), fmt.Sprintf("no %q in the log (%v)", line, err)
	})
}
