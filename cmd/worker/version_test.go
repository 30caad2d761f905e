package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/internal/buildinfo"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// `worker version`, `worker --version` and `worker version --json` print
// this build's version, revision and Go version, and need no setting.
func TestVersionCommand(t *testing.T) {
	t.Parallel()
	want := buildinfo.Read()
	for _, args := range [][]string{{"version"}, {"--version"}} {
		var stdout, stderr bytes.Buffer
		if code := run(t.Context(), args, envOf(nil), nil, &stdout, &stderr); code != 0 {
			t.Fatalf("worker %v exited %d: %s", args, code, stderr.String())
		}
		if got := strings.TrimSpace(stdout.String()); got != want.String() {
			t.Errorf("worker %v printed %q, want %q", args, got, want.String())
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), []string{"version", "--json"}, envOf(nil), nil, &stdout, &stderr); code != 0 {
		t.Fatalf("worker version --json exited %d: %s", code, stderr.String())
	}
	var got buildinfo.Info
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil || got != want {
		t.Errorf("worker version --json = %s (%v), want %+v", stdout.String(), err, want)
	}
	if code := run(t.Context(), []string{"version", "extra"}, envOf(nil), nil, &stdout, &stderr); code != 2 {
		t.Errorf("worker version extra exited %d, want 2", code)
	}
}

// The connection name carries the worker id and the version, and fits
// MongoDB's 128-byte appName however long the id.
func TestConnectionName(t *testing.T) {
	t.Parallel()
	v := buildinfo.Read().Short()
	if got, want := connectionName("outbox-worker", "pod-7"), "outbox-worker pod-7 "+v; got != want {
		t.Errorf("connectionName = %q, want %q", got, want)
	}
	long := connectionName("outbox-worker", strings.Repeat("x", 300))
	if len(long) > 128 || !strings.HasSuffix(long, " "+v) || !strings.HasPrefix(long, "outbox-worker xxx") {
		t.Errorf("connectionName of a 300-byte id = %q (%d bytes), want at most 128 bytes ending in the version", long, len(long))
	}
}

// The worker's database client says who it is in its handshake (the
// appName of db.currentOp() and the server's log): a listener that reads
// the handshake the worker's client sends finds the worker id and the
// version in it.
func TestMongoHandshakeNamesTheReplica(t *testing.T) {
	t.Parallel()
	ln, err := new(net.ListenConfig).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 4096)
		n, _ := c.Read(buf) // the handshake is the first message
		got <- buf[:n]
	}()
	cfg, _, err := loadConfig("run", nil, envOf(map[string]string{
		"OUTBOX_MONGO_URI": "mongodb://" + ln.Addr().String() + "/?directConnection=true",
		"OUTBOX_WORKER_ID": "replica-7", "OUTBOX_HTTP_ADDR": "127.0.0.1:0",
	}), relayCommand, nil)
	if err != nil {
		t.Fatal(err)
	}
	w, err := newWorker(cfg, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.client.Disconnect(context.WithoutCancel(t.Context())) }()
	hello := <-got
	if want := connectionName("outbox-worker", "replica-7"); !bytes.Contains(hello, []byte(want)) {
		t.Errorf("the handshake does not carry the appName %q:\n%q", want, hello)
	}
}

// buildStamped builds the worker with a version and revision stamped by
// the linker, as a release is built.
func buildStamped(t *testing.T, version, revision string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "worker")
	pkg := "github.com/outboxrelay/outbox/internal/buildinfo"
	cmd := exec.CommandContext(t.Context(), "go", "build", "-o", bin,
		"-ldflags", "-X "+pkg+".Version="+version+" -X "+pkg+".Revision="+revision, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// A release build names its version everywhere an operator looks: worker
// version, the start-up line, /status, outbox_build_info, and the name of
// its broker connection.
func TestStampedBuildSaysItsVersion(t *testing.T) {
	t.Parallel()
	const version, revision = "v9.8.7", "0123456789abcdef0123456789abcdef01234567"
	bin := buildStamped(t, version, revision)
	out, err := exec.CommandContext(t.Context(), bin, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := "outbox worker v9.8.7 (revision " + revision + ", "; !strings.HasPrefix(string(out), want) {
		t.Errorf("worker --version = %q, want it to start %q", out, want)
	}

	s := localStack(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	db, _, exchange, _ := s.relayed(t)
	workerID := db.Name() + "-stamped"
	env := s.relayEnv(db.Name(), exchange, workerID)
	env["OUTBOX_LOG_LEVEL"] = "info"
	p := startWorkerBin(t, bin, "stamped", env)

	var status struct {
		Build buildinfo.Info `json:"build"`
	}
	getStatus(ctx, t, p, &status)
	if status.Build.Version != version || status.Build.Revision != revision {
		t.Errorf("/status build = %+v, want version %s, revision %s", status.Build, version, revision)
	}
	_, metrics, err := httpGet(ctx, "http://"+httpAddr(t, p)+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if want := `outbox_build_info{goversion="` + status.Build.GoVersion + `",revision="` + revision + `",version="` + version + `"} 1`; !strings.Contains(string(metrics), want) {
		t.Errorf("/metrics lacks %s", want)
	}
	if log := readLog(t, p); !strings.Contains(log, `"version":"v9.8.7","revision":"`+revision+`"`) || !strings.Contains(log, `"msg":"worker starting"`) {
		t.Errorf("the start-up line does not name the version and revision:\n%s", log)
	}
	wantName := "outbox-worker " + workerID + " " + version
	if _, err := exec.LookPath("rabbitmqctl"); err != nil && os.Getenv("CI") == "" {
		t.Log("rabbitmqctl is not on PATH: the broker connection's name is not checked (CI checks it)")
	} else {
		testenv.Eventually(t, timeLeft(ctx), func() (bool, string) {
			out, err := exec.CommandContext(ctx, "rabbitmqctl", "-q", "list_connections", "client_properties").CombinedOutput()
			if err != nil {
				return false, fmt.Sprintf("rabbitmqctl list_connections: %v: %s", err, out)
			}
			return strings.Contains(string(out), wantName), "no RabbitMQ connection is named " + wantName
		})
	}
	stopWorkers(t, p)
}
