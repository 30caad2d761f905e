package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxrelay/outbox/internal/memlimit"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/internal/workerproc"
)

// workerBin is the worker binary, built once per test binary.
var workerBin struct {
	once sync.Once
	dir  string
	path string
	err  error
}

func TestMain(m *testing.M) {
	// The configuration's tests expect the defaults of a machine without
	// a memory limit, whatever this one's cgroup says (see memory_test.go).
	readMemoryLimit = func(func(string) string) memlimit.Limit { return memlimit.Limit{} }
	code := m.Run()
	if workerBin.dir != "" {
		_ = os.RemoveAll(workerBin.dir)
	}
	// The tests run services in this process too (run itself, claimers,
	// owners, test proxies): none may outlive its test.
	if code == 0 {
		// Up to a minute for the embedded FerretDB to finish what the
		// stopped workers left it: it runs a query to its end after its
		// client has gone, and behind the e2e tests' largest heads
		// (OUTBOX_E2E_HELD_HEAD=5000) a connection was still at it when
		// goleak's default two seconds were up.
		err := goleak.Find(testenv.LeakOptions()...)
		for deadline := time.Now().Add(time.Minute); err != nil && time.Now().Before(deadline); {
			time.Sleep(time.Second)
			err = goleak.Find(testenv.LeakOptions()...)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
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
		out, err := exec.CommandContext(context.Background(), "go", "build", "-o", workerBin.path, ".").CombinedOutput() // built once for every test
		if err != nil {
			workerBin.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if workerBin.err != nil {
		t.Fatalf("build the worker: %v", workerBin.err)
	}
	return workerBin.path
}

// startWorker starts `worker run` with env; its output goes to a file in
// t.TempDir. In t.Cleanup the process is killed if it still runs, and the
// end of its log is printed if the test failed.
func startWorker(t *testing.T, name string, env map[string]string) *workerproc.Proc {
	t.Helper()
	return startWorkerBin(t, workerBinary(t), name, env)
}

// startWorkerBin is startWorker with the worker binary bin: another
// build, such as an earlier version's.
func startWorkerBin(t *testing.T, bin, name string, env map[string]string) *workerproc.Proc {
	t.Helper()
	p, err := workerproc.Start(workerproc.Config{
		Bin: bin, Name: name, Env: workerproc.Environ(env),
		LogPath: filepath.Join(t.TempDir(), name+".log"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("%s: last lines of its log:\n%s", name, p.Tail(30))
		}
	})
	return p
}

// stopWorkers sends SIGTERM to every process, then checks that each exits
// 0 within the shutdown timeout: they stop side by side.
func stopWorkers(t *testing.T, procs ...*workerproc.Proc) {
	t.Helper()
	for _, p := range procs {
		if err := p.Signal(syscall.SIGTERM); err != nil {
			t.Error(err)
		}
	}
	for _, p := range procs {
		state, exited := p.Wait(shutdownTimeout + 5*time.Second)
		switch {
		case !exited:
			t.Errorf("%s still running %s after SIGTERM", p.Name(), shutdownTimeout+5*time.Second)
		case state.ExitCode() != 0:
			t.Errorf("%s exited with code %d after SIGTERM, want 0", p.Name(), state.ExitCode())
		}
	}
}

// httpGet sends GET url and returns the response's status code and body.
func httpGet(ctx context.Context, url string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}
