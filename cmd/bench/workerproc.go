package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/outboxrelay/outbox/internal/workerproc"
)

// workerProc is one bin/worker process started by the harness.
type workerProc struct {
	*workerproc.Proc
	id   string
	addr string // its OUTBOX_HTTP_ADDR
	// pprofAddr is its OUTBOX_PPROF_ADDR.
	pprofAddr string
}

// workerOpts is what differs between the worker runs.
type workerOpts struct {
	id         string
	collection string
	exchange   string
	schedule   string
	env        []string // more environment, after the harness's -worker-env
	// bin is the worker binary; empty means -worker.
	bin string
	// mongoURI is the database the worker connects to; empty means the
	// harness's (a slow stage gives it a proxy's).
	mongoURI string
	// defaults leaves OUTBOX_CLAIM_SCHEDULE and OUTBOX_BATCH_SIZE unset,
	// so that the worker runs at its own defaults; schedule is then
	// ignored.
	defaults bool
}

// startWorker starts bin/worker run against the harness's database and
// broker, its log under raw/.
func (b *bench) startWorker(opts workerOpts) (*workerProc, error) {
	addr, err := workerproc.FreeAddr()
	if err != nil {
		return nil, err
	}
	pprofAddr, err := workerproc.FreeAddr()
	if err != nil {
		return nil, err
	}
	env := append(os.Environ(),
		"OUTBOX_MONGO_URI="+cmp.Or(opts.mongoURI, b.mongoURI),
		"OUTBOX_MONGO_DATABASE="+databaseName,
		"OUTBOX_MONGO_COLLECTION="+opts.collection,
		"OUTBOX_AMQP_URL="+b.cfg.AMQPURL,
		"OUTBOX_AMQP_EXCHANGE="+opts.exchange,
		"OUTBOX_HTTP_ADDR="+addr,
		"OUTBOX_WORKER_ID="+opts.id,
		"OUTBOX_PPROF_ADDR="+pprofAddr,
		"OUTBOX_LOG_LEVEL=warn",
		"OUTBOX_LOG_FORMAT=text",
	)
	if !opts.defaults {
		env = append(env,
			"OUTBOX_CLAIM_SCHEDULE="+opts.schedule,
			"OUTBOX_BATCH_SIZE="+strconv.Itoa(b.cfg.BatchSize))
	}
	env = append(env, b.cfg.WorkerEnv...)
	env = append(env, opts.env...)
	p, err := workerproc.Start(workerproc.Config{
		Bin: cmp.Or(opts.bin, b.cfg.WorkerBin), Name: "worker " + opts.id, Env: env,
		LogPath: filepath.Join(b.rawDir, opts.id+".log"),
	})
	if err != nil {
		return nil, err
	}
	return &workerProc{Proc: p, id: opts.id, addr: addr, pprofAddr: pprofAddr}, nil
}

// waitReady polls /readyz until the worker is connected to both servers.
func (w *workerProc) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case <-w.Done():
			return fmt.Errorf("worker %s exited (see its log)", w.id)
		default:
		}
		if code, _ := httpGet(ctx, "http://"+w.addr+"/readyz", io.Discard); code == http.StatusOK {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("worker %s not ready after %s", w.id, timeout)
}

// outboxLabel is the outbox label of a sample, with the comma that joins
// it to the others.
var outboxLabel = regexp.MustCompile(`,outbox="[^"]*"|outbox="[^"]*",?`)

// withoutOutbox is a sample line without its outbox label: the harness
// relays one outbox, whose samples read as a worker's did before the
// label (the baseline binary's still do).
func withoutOutbox(line string) string {
	return strings.Replace(outboxLabel.ReplaceAllString(line, ""), "{}", "", 1)
}

// metricLine matches a sample of a counter the harness reads.
var metricLine = regexp.MustCompile(`^(outbox_db_commands_total|outbox_events_published_total|outbox_claim_runs_total|outbox_job_errors_total|outbox_job_runs_left_out_total)(?:\{(?:command|result|job)="([^"]*)"\})? ([0-9.e+]+)$`)

// workerMetrics are the counters the harness reads from a worker.
type workerMetrics struct {
	published float64
	// commands are the database commands sent, by command; claimRuns
	// the claim runs, by outcome (claimed, idle, ...). Each lists only
	// what is above 0.
	commands, claimRuns map[string]float64
	// jobErrors and leftOut are the periodic jobs' failed runs and runs
	// left out, by job.
	jobErrors, leftOut map[string]float64
}

// readClaims are the claim runs that read the outbox: those that claimed
// and those that found nothing.
func (m workerMetrics) readClaims() int {
	return int(m.claimRuns["claimed"] + m.claimRuns["idle"])
}

// scrape reads the worker's published and database-command counters.
func (w *workerProc) scrape(ctx context.Context) (published float64, commands map[string]float64, err error) {
	m, err := w.metrics(ctx)
	return m.published, m.commands, err
}

// metricsAfter reads the worker's counters once it has counted at least
// published events PUBLISHED, or after settleMetrics: a batch's events
// reach the consumer before the worker has marked them and counted its
// claim run, so counters read at the last arrival miss the last batch.
func (w *workerProc) metricsAfter(ctx context.Context, published float64) (workerMetrics, error) {
	deadline := time.Now().Add(settleMetrics)
	for {
		m, err := w.metrics(ctx)
		if err != nil || m.published >= published || time.Now().After(deadline) {
			return m, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// settleMetrics bounds metricsAfter's wait.
const settleMetrics = 20 * time.Second

// metrics reads the worker's counters the harness uses.
func (w *workerProc) metrics(ctx context.Context) (workerMetrics, error) {
	pr, pw := io.Pipe()
	go func() {
		_, err := httpGet(ctx, "http://"+w.addr+"/metrics", pw)
		pw.CloseWithError(err)
	}()
	m := workerMetrics{commands: map[string]float64{}, claimRuns: map[string]float64{}, jobErrors: map[string]float64{}, leftOut: map[string]float64{}}
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		line := metricLine.FindStringSubmatch(withoutOutbox(sc.Text()))
		if line == nil {
			continue
		}
		v, _ := strconv.ParseFloat(line[3], 64)
		switch {
		case line[1] == "outbox_events_published_total":
			m.published = v
		case v == 0:
			// Every command and outcome is exported from the start at
			// 0; the reports list those that happened.
		case line[1] == "outbox_claim_runs_total":
			m.claimRuns[line[2]] = v
		case line[1] == "outbox_job_errors_total":
			m.jobErrors[line[2]] = v
		case line[1] == "outbox_job_runs_left_out_total":
			m.leftOut[line[2]] = v
		default:
			m.commands[line[2]] = v
		}
	}
	if err := sc.Err(); err != nil {
		return workerMetrics{}, fmt.Errorf("scrape %s: %w", w.id, err)
	}
	return m, nil
}

// profile saves a CPU profile of d seconds from /debug/pprof/profile.
func (w *workerProc) profile(ctx context.Context, d time.Duration, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", w.pprofAddr, int(d.Seconds()))
	code, err := httpGet(ctx, url, f)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("HTTP %d", code)
	}
	if err != nil {
		return fmt.Errorf("profile %s: %w", w.id, err)
	}
	return nil
}

// procStats is a stopped worker's resource use.
type procStats struct {
	cpu time.Duration // user + system, from the rusage
	// peakRSSMB is the process's VmHWM, read just before SIGTERM. The
	// rusage's maxrss is no good here: Go starts children with
	// vfork+exec, and Linux carries the parent's (the harness's, with
	// FerretDB in it) high-water mark into the child's maxrss at exec.
	peakRSSMB float64
	// rusageMaxRSSMB is that maxrss, kept for the record.
	rusageMaxRSSMB float64
	exitCode       int
}

// stop sends SIGTERM, waits for a clean exit and returns the process's
// rusage. A worker that does not exit in time is killed and reported.
func (w *workerProc) stop(timeout time.Duration) (procStats, error) {
	hwm := vmHWM(w.Pid())
	state, err := w.Stop(timeout)
	if state == nil {
		return procStats{}, err
	}
	st := procStats{exitCode: state.ExitCode(), peakRSSMB: hwm}
	if ru, ok := state.SysUsage().(*syscall.Rusage); ok {
		st.cpu = time.Duration(syscall.TimevalToNsec(ru.Utime) + syscall.TimevalToNsec(ru.Stime))
		st.rusageMaxRSSMB = float64(ru.Maxrss) / 1024 // kilobytes on Linux
	}
	if err != nil {
		return st, fmt.Errorf("%w (see its log)", err)
	}
	return st, nil
}

// vmHWM returns the peak resident set size of a running process in MB,
// from /proc/<pid>/status, or 0 where that cannot be read.
func vmHWM(pid int) float64 {
	kb, err := strconv.Atoi(strings.Fields(procField(fmt.Sprintf("/proc/%d/status", pid), "VmHWM") + " 0")[0])
	if err != nil {
		return 0
	}
	return float64(kb) / 1024
}

func httpGet(ctx context.Context, url string, w io.Writer) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil && !errors.Is(err, io.ErrClosedPipe) {
		return resp.StatusCode, err
	}
	return resp.StatusCode, nil
}

// WorkerCost is what one worker process cost to relay a stage's events:
// the same figures for every stage that times a worker on a backlog.
type WorkerCost struct {
	DBCommands        map[string]float64 `json:"dbCommands,omitempty"`
	DBCommandsPer1000 float64            `json:"dbCommandsPer1000"`
	CPUSeconds        float64            `json:"cpuSeconds"`
	CPUMsPer1000      float64            `json:"cpuMsPer1000"`
	PeakRSSMB         float64            `json:"peakRssMB"` // VmHWM just before SIGTERM
	ExitCode          int                `json:"exitCode"`
	// Error says what went wrong: not every event in time, or an unclean
	// exit.
	Error string `json:"error,omitempty"`
}

// record fills c from the stopped worker's resource use, per 1,000 of the
// delivered events, and adds stopErr, if any, to the error.
func (c *WorkerCost) record(st procStats, stopErr error, delivered int) {
	c.CPUSeconds = round(st.cpu.Seconds(), 3)
	c.PeakRSSMB = round(st.peakRSSMB, 1)
	c.ExitCode = st.exitCode
	if k := float64(delivered) / 1000; k > 0 {
		c.CPUMsPer1000 = round(1000*st.cpu.Seconds()/k, 1)
		c.DBCommandsPer1000 = round(sum(c.DBCommands)/k, 1)
	}
	if stopErr != nil {
		c.Error = strings.TrimPrefix(c.Error+"; "+stopErr.Error(), "; ")
	}
}
