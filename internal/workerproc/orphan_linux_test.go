package workerproc

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// orphanParentEnv makes this test binary the starter of a worker that
// dies without cleanup, as a test binary does when it panics at its
// -timeout.
const orphanParentEnv = "OUTBOX_TEST_WORKERPROC_ORPHAN_PIDFILE"

// A worker does not outlive the process that started it, even when that
// process dies without stopping it.
func TestWorkerDiesWithItsStarter(t *testing.T) {
	if pidFile := os.Getenv(orphanParentEnv); pidFile != "" {
		startAndDie(pidFile)
		return
	}
	t.Parallel()
	pidFile := filepath.Join(t.TempDir(), "worker.pid")
	starter := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestWorkerDiesWithItsStarter$")
	starter.Env = append(os.Environ(), orphanParentEnv+"="+pidFile)
	if out, err := starter.CombinedOutput(); err != nil {
		t.Fatalf("the starter: %v\n%s", err, out)
	}
	raw, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("the starter wrote no pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatalf("pid %q: %v", raw, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	testenv.Eventually(t, testenv.WaitTimeout, func() (bool, string) {
		return !alive(pid), "the worker " + strconv.Itoa(pid) + " still runs after its starter died"
	})
}

// startAndDie starts a worker that would run for minutes, writes its pid
// and exits at once, stopping nothing.
func startAndDie(pidFile string) {
	p, err := Start(Config{Bin: "/bin/sleep", Name: "sleep", Args: []string{"600"}, LogPath: pidFile + ".log"})
	if err != nil {
		os.Exit(2)
	}
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(p.cmd.Process.Pid)), 0o600); err != nil {
		os.Exit(3)
	}
	os.Exit(0)
}

// alive reports whether pid runs: a zombie, dead but not yet reaped by
// whoever adopted it, does not.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command's closing parenthesis.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
