package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/internal/buildinfo"
	"github.com/outboxrelay/outbox/internal/otlpsink"
	"github.com/outboxrelay/outbox/internal/telemetry"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// `worker version`, `worker --version` and `worker version --json` print
// this build's version, revision, build date, Go version and platform,
// and need no setting.
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
	defer func() { _ = w.disconnect(context.WithoutCancel(t.Context())) }()
	hello := <-got
	if want := connectionName("outbox-worker", "replica-7"); !bytes.Contains(hello, []byte(want)) {
		t.Errorf("the handshake does not carry the appName %q:\n%q", want, hello)
	}
}

// buildStamped builds the worker with a version, revision and build
// date stamped by the linker, as a release is built.
func buildStamped(t *testing.T, version, revision, date string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "worker")
	pkg := "github.com/outboxrelay/outbox/internal/buildinfo"
	cmd := exec.CommandContext(t.Context(), "go", "build", "-o", bin,
		"-ldflags", "-X "+pkg+".Version="+version+" -X "+pkg+".Revision="+revision+" -X "+pkg+".BuildDate="+date, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// A release build names its version, revision, build date and platform
// everywhere an operator looks: worker version, the start-up line,
// /status, outbox_build_info, the service.version of its traces, and the
// name of its broker connection.
func TestStampedBuildSaysItsVersion(t *testing.T) {
	t.Parallel()
	const version, revision, date = "v9.8.7", "0123456789abcdef0123456789abcdef01234567", "2026-11-27T21:15:04Z"
	platform := runtime.GOOS + "/" + runtime.GOARCH
	bin := buildStamped(t, version, revision, date)
	out, err := exec.CommandContext(t.Context(), bin, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := "outbox worker v9.8.7 (revision " + revision + ", built " + date + ", go"; !strings.HasPrefix(string(out), want) ||
		!strings.HasSuffix(string(out), " "+platform+")\n") {
		t.Errorf("worker --version = %q, want it to start %q and end with %s", out, want, platform)
	}

	s := localStack(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	db, _, exchange, _ := s.relayed(t)
	workerID := db.Name() + "-stamped"
	env := s.relayEnv(db.Name(), exchange, workerID)
	env["OUTBOX_LOG_LEVEL"] = "info"
	// Its traces: the spans of its database commands, from the start.
	sink := otlpsink.New()
	srv := httptest.NewServer(sink)
	t.Cleanup(srv.Close)
	env["OTEL_TRACES_EXPORTER"] = "otlp"
	env["OTEL_EXPORTER_OTLP_ENDPOINT"] = srv.URL
	env["OTEL_BSP_SCHEDULE_DELAY"] = "100"
	env["OUTBOX_TRACE_MONGO"] = "true"
	p := startWorkerBin(t, bin, "stamped", env)

	var status struct {
		Build buildinfo.Info `json:"build"`
	}
	getStatus(ctx, t, p, &status)
	if want := (buildinfo.Info{Version: version, Revision: revision, BuildDate: date, GoVersion: status.Build.GoVersion,
		GOOS: runtime.GOOS, GOARCH: runtime.GOARCH}); status.Build != want || !strings.HasPrefix(status.Build.GoVersion, "go") {
		t.Errorf("/status build = %+v, want %+v", status.Build, want)
	}
	_, metrics, err := httpGet(ctx, "http://"+httpAddr(t, p)+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if want := `outbox_build_info{build_date="` + date + `",goarch="` + runtime.GOARCH + `",goos="` + runtime.GOOS +
		`",goversion="` + status.Build.GoVersion + `",revision="` + revision + `",version="` + version + `"} 1`; !strings.Contains(string(metrics), want) {
		t.Errorf("/metrics lacks %s", want)
	}
	if log := readLog(t, p); !strings.Contains(log, `"version":"v9.8.7","revision":"`+revision+`","build_date":"`+date+`"`) ||
		!strings.Contains(log, `"goos":"`+runtime.GOOS+`","goarch":"`+runtime.GOARCH+`"`) || !strings.Contains(log, `"msg":"worker starting"`) {
		t.Errorf("the start-up line does not name the version, revision, build date and platform:\n%s", log)
	}
	testenv.Eventually(t, timeLeft(ctx), func() (bool, string) {
		spans := sink.Spans()
		for _, sp := range spans {
			if sp.Resource["service.name"] == telemetry.ServiceNameDefault {
				return true, ""
			}
		}
		return false, fmt.Sprintf("no span of the worker among %d received", len(spans))
	})
	for _, sp := range sink.Spans() {
		if sp.Resource["service.name"] == telemetry.ServiceNameDefault && sp.Resource["service.version"] != version {
			t.Errorf("span %s: resource service.version = %q, want %q (resource %v)", sp.Name, sp.Resource["service.version"], version, sp.Resource)
			break
		}
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
