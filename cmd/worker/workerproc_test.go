package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// workerBin is the worker binary, built once per test binary.
var workerBin struct {
	once sync.Once
	dir  string
	path string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if workerBin.dir != "" {
		_ = os.RemoveAll(workerBin.dir)
	}
	os.Exit(code)
}

// workerBinary builds this package once per test binary and returns the
// path of the executable. It lives in a directory of its own, removed by
// TestMain, since every test of the binary uses it.
func workerBinary(t testing.TB) string {
	t.Helper()
	workerBin.once.Do(func() {
		workerBin.dir, workerBin.err = os.MkdirTemp("", "outbox-worker-e2e-")
		if workerBin.err != nil {
			return
		}
		workerBin.path = filepath.Join(workerBin.dir, "worker")
		// go test puts its own go command first on PATH.
		out, err := exec.Command("go", "build", "-o", workerBin.path, ".").CombinedOutput()
		if err != nil {
			workerBin.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if workerBin.err != nil {
		t.Fatalf("build the worker: %v", workerBin.err)
	}
	return workerBin.path
}

// processEnv is this process's environment without any OUTBOX_ variable,
// plus env.
func processEnv(env map[string]string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOX_") {
			out = append(out, kv)
		}
	}
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

// workerProc is one `worker run` process.
type workerProc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has exited
}

// startWorker starts `worker run` with env; its output goes to a file in
// t.TempDir. In t.Cleanup the process is killed if it still runs, and the
// end of its log is printed if the test failed.
func startWorker(t *testing.T, name string, env map[string]string) *workerProc {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(workerBinary(t), "run")
	cmd.Env = processEnv(env)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &workerProc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait() // the exit status is read from cmd.ProcessState
		_ = logFile.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s: last lines of its log:\n%s", name, p.tail(30))
		}
	})
	return p
}

func (p *workerProc) signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return fmt.Errorf("%s has exited (%v) before %v", p.name, p.cmd.ProcessState, sig)
	default:
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal %s: %w", p.name, err)
	}
	return nil
}

// wait waits up to timeout for the process to exit and returns its exit
// code (-1 when a signal killed it).
func (p *workerProc) wait(timeout time.Duration) (code int, exited bool) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode(), true
	case <-timer.C:
		return 0, false
	}
}

// tail returns the last n lines of the process's log.
func (p *workerProc) tail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// stopWorkers sends SIGTERM to every process and checks that each exits 0
// within the shutdown timeout.
func stopWorkers(t *testing.T, procs ...*workerProc) {
	t.Helper()
	for _, p := range procs {
		if err := p.signal(syscall.SIGTERM); err != nil {
			t.Error(err)
		}
	}
	for _, p := range procs {
		code, exited := p.wait(shutdownTimeout + 5*time.Second)
		switch {
		case !exited:
			t.Errorf("%s still running %s after SIGTERM", p.name, shutdownTimeout+5*time.Second)
		case code != 0:
			t.Errorf("%s exited with code %d after SIGTERM, want 0", p.name, code)
		}
	}
}
