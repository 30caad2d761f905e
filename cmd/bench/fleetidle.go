package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/internal/backoff"
)

// fleetIdleSettle is how long the fleet-idle worker runs before its
// commands are counted: its start-up (indexes, first takes, the first
// samples) is over, and idle claims have backed off to their cap (about
// twice OUTBOX_CLAIM_IDLE_MAX, 60 s at the default).
const fleetIdleSettle = 90 * time.Second

// fleetIdleWindow is how long commands are counted once settled.
const fleetIdleWindow = 60 * time.Second

// FleetIdle is what a fleet of idle outboxes costs one replica.
type FleetIdle struct {
	Outboxes  int `json:"outboxes"`
	Databases int `json:"databases"`
	// Runs are the worker's runs, each under its environment.
	Runs []FleetIdleRun `json:"runs"`
}

// FleetIdleRun is one worker's idle cost and first-event wait.
type FleetIdleRun struct {
	Name      string  `json:"name"`
	Env       string  `json:"env,omitempty"`
	Outboxes  int     `json:"outboxes"`
	Databases int     `json:"databases"`
	WindowS   float64 `json:"windowS"`
	CommandsS float64 `json:"commandsPerS"`
	// CommandsPerBoxS is CommandsS per outbox.
	CommandsPerBoxS float64 `json:"commandsPerOutboxPerS"`
	// ByCommand are the commands per second by command name.
	ByCommand map[string]float64 `json:"byCommand"`
	// ClaimReadsS are the claim runs that read an outbox per second, of
	// all outboxes.
	ClaimReadsS float64 `json:"claimReadsPerS"`
	RSSMB       float64 `json:"rssMB"`
	RSSPerBoxMB float64 `json:"rssPerOutboxMB"`
	// FirstEventMs is how long the first event written to an outbox
	// idle since the worker started waited, createdAt to receipt.
	FirstEventMs float64 `json:"firstEventMs"`
	Error        string  `json:"error,omitempty"`
}

// fleetIdleVariants are the worker runs the stage compares: the
// defaults on the whole fleet, then the idle back-off off (a cap of one
// tick) on a tenth of it, then the whole fleet with a stale threshold
// of ten minutes, the lever on the ownership's cost. 200 outboxes polling every second are more
// than embedded FerretDB on two cores answers (measured: its pool of 100
// connections stayed exhausted, ownership rounds timed out); a tenth
// gives the cost per outbox without the back-off.
var fleetIdleVariants = []struct {
	name, env string
	share     int // the fleet's outboxes and databases divided by it
}{
	{"defaults", "", 1},
	{"no idle back-off", "OUTBOX_CLAIM_IDLE_MAX=1s", 10},
	// Terms of 5 minutes: the ownership's rounds and renewals every 100 s.
	{"stale threshold 10m", "OUTBOX_STALE_AFTER=10m", 1},
}

// fleetIdle starts one worker on a fleet file of idle outboxes spread
// over databases, lets it settle, counts its database commands over a
// window, reads its RSS, and times the first event written to a
// long-idle outbox; once per variant.
func (b *bench) fleetIdle(ctx context.Context) error {
	f := FleetIdle{Outboxes: b.cfg.FleetOutboxes, Databases: b.cfg.FleetDatabases}
	for _, v := range fleetIdleVariants {
		if len(b.cfg.FleetVariants) > 0 && !slices.Contains(b.cfg.FleetVariants, v.name) {
			continue
		}
		n, dbs := max(b.cfg.FleetOutboxes/v.share, 1), max(b.cfg.FleetDatabases/v.share, 1)
		run, err := b.fleetIdleRun(ctx, v.name, v.env, n, dbs)
		if err != nil {
			run.Error = err.Error()
		}
		f.Runs = append(f.Runs, run)
		fleetIdleFig.set(b.res, f)
		fmt.Fprintf(b.out, "   %s, %d outboxes in %d databases: %.1f commands/s %v, %.2f claim reads/s; RSS %.1f MB, %.2f MB per outbox; first event after %.0f s idle waited %.0f ms %s\n",
			run.Name, run.Outboxes, run.Databases, run.CommandsS, run.ByCommand, run.ClaimReadsS, run.RSSMB, run.RSSPerBoxMB,
			(fleetIdleSettle + fleetIdleWindow).Seconds(), run.FirstEventMs, run.Error)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

// fleetIdleRun is one run of fleetIdle.
func (b *bench) fleetIdleRun(ctx context.Context, name, env string, n, dbs int) (FleetIdleRun, error) {
	run := FleetIdleRun{Name: name, Env: env, Outboxes: n, Databases: dbs, WindowS: fleetIdleWindow.Seconds()}
	exchange := fmt.Sprintf("bench.fleet-idle.%d", time.Now().UnixNano())
	boxes, err := b.fleetFile(ctx, "fleet-idle", exchange, n, dbs)
	if err != nil {
		return run, err
	}
	defer b.dropFleet(boxes)
	cons, err := newConsumer(b.cfg.AMQPURL, exchange)
	if err != nil {
		return run, err
	}
	defer cons.close()
	wenv := []string{"OUTBOX_FLEET_FILE=" + boxes.path}
	if env != "" {
		wenv = append(wenv, env)
	}
	w, err := b.startWorker(workerOpts{id: "fleet-idle-" + strings.ReplaceAll(name, " ", "-"), collection: "unused", exchange: exchange, defaults: true, env: wenv})
	if err != nil {
		return run, err
	}
	defer func() { _, _ = w.stop(time.Minute) }()
	if err := w.waitReady(ctx, 10*time.Minute); err != nil {
		return run, err
	}
	if !backoff.Sleep(ctx, fleetIdleSettle) {
		return run, ctx.Err()
	}
	before, err := w.sums(ctx)
	if err != nil {
		return run, err
	}
	t0 := time.Now()
	if !backoff.Sleep(ctx, fleetIdleWindow) {
		return run, ctx.Err()
	}
	after, err := w.sums(ctx)
	if err != nil {
		return run, err
	}
	run.fill(before, after, time.Since(t0), vmRSS(w.Pid()), n)
	run.FirstEventMs, err = firstEventWait(ctx, boxes.colls[0], cons)
	return run, err
}

// fill sets run's rates from two scrapes d apart, and its RSS.
func (run *FleetIdleRun) fill(before, after map[string]float64, d time.Duration, rssMB float64, outboxes int) {
	run.ByCommand = map[string]float64{}
	secs := d.Seconds()
	for k, v := range after {
		n := v - before[k]
		switch {
		case n <= 0:
		case strings.HasPrefix(k, "outbox_db_commands_total"):
			run.CommandsS += n / secs
			run.ByCommand[labelValue(k)] = round(n/secs, 2)
		case k == `outbox_claim_runs_total{result="claimed"}` || k == `outbox_claim_runs_total{result="idle"}`:
			run.ClaimReadsS += n / secs
		}
	}
	run.CommandsS = round(run.CommandsS, 2)
	run.CommandsPerBoxS = round(run.CommandsS/float64(outboxes), 3)
	run.ClaimReadsS = round(run.ClaimReadsS, 2)
	run.RSSMB = round(rssMB, 1)
	run.RSSPerBoxMB = round(rssMB/float64(outboxes), 3)
}

// firstEventWait writes one event to coll and returns how long it took,
// from its createdAt, to reach the consumer.
func firstEventWait(ctx context.Context, coll *driver.Collection, cons *consumer) (float64, error) {
	doc, err := eventDoc(0, time.Now())
	if err != nil {
		return 0, err
	}
	res, err := coll.InsertOne(ctx, doc)
	if err != nil {
		return 0, err
	}
	id := res.InsertedID.(bson.ObjectID).Hex()
	written := time.Now()
	if err := cons.waitFor(ctx, 1, 2*time.Minute); err != nil {
		return 0, err
	}
	at, ok := cons.FirstArrivals()[id]
	if !ok {
		return 0, fmt.Errorf("event %s not among those received", id)
	}
	return round(float64(at.Sub(written))/float64(time.Millisecond), 0), nil
}

// fleetBoxes are the collections of a fleet file the harness wrote.
type fleetBoxes struct {
	path  string
	dbs   []*driver.Database
	colls []*driver.Collection
}

// fleetFile writes a fleet file of n outboxes spread over dbs databases
// named <prefix>_<i>, each database dropped first, all publishing to
// exchange, and returns it.
func (b *bench) fleetFile(ctx context.Context, prefix, exchange string, n, dbs int) (fleetBoxes, error) {
	var fb fleetBoxes
	var yaml strings.Builder
	yaml.WriteString("outboxes:\n")
	safe := strings.ReplaceAll(prefix, "-", "_")
	for d := range dbs {
		db := b.client.Database(fmt.Sprintf("%s_%02d", safe, d))
		if err := db.Drop(ctx); err != nil {
			return fb, fmt.Errorf("drop %s: %w", db.Name(), err)
		}
		fb.dbs = append(fb.dbs, db)
	}
	for i := range n {
		db := fb.dbs[i%dbs]
		coll := db.Collection(fmt.Sprintf("outbox_%03d", i))
		fb.colls = append(fb.colls, coll)
		fmt.Fprintf(&yaml, "  - name: box-%03d\n    database: %s\n    collection: %s\n    exchange: %s\n", i, db.Name(), coll.Name(), exchange)
	}
	fb.path = filepath.Join(b.rawDir, prefix+".yaml")
	return fb, os.WriteFile(fb.path, []byte(yaml.String()), 0o600)
}

// dropFleet drops the fleet's databases.
func (b *bench) dropFleet(fb fleetBoxes) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, db := range fb.dbs {
		_ = db.Drop(ctx)
	}
}

// sampleLine is a sample of the exposition format: name, labels, value.
var sampleLine = regexp.MustCompile(`^([a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$`)

// sums reads the worker's metrics and adds up each series over its
// outboxes: the key is the name and the labels without the outbox's.
func (w *workerProc) sums(ctx context.Context) (map[string]float64, error) {
	pr, pw := io.Pipe()
	go func() {
		_, err := httpGet(ctx, "http://"+w.addr+"/metrics", pw)
		pw.CloseWithError(err)
	}()
	out := map[string]float64{}
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		m := sampleLine.FindStringSubmatch(withoutOutbox(sc.Text()))
		if m == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err == nil {
			out[m[1]+m[2]] += v
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("scrape %s: %w", w.id, err)
	}
	return out, nil
}

// labelValue is the value of a series' one label: find of
// outbox_db_commands_total{command="find"}.
func labelValue(series string) string {
	_, v, _ := strings.Cut(series, `="`)
	return strings.TrimSuffix(v, `"}`)
}

// vmRSS is a running process's resident set size in MB, from
// /proc/<pid>/status; 0 where it cannot be read.
func vmRSS(pid int) float64 {
	kb, err := strconv.Atoi(strings.Fields(procField(fmt.Sprintf("/proc/%d/status", pid), "VmRSS") + " 0")[0])
	if err != nil {
		return 0
	}
	return float64(kb) / 1024
}

// fleetIdleFig is the idle fleet's cost.
var fleetIdleFig = figure[FleetIdle]{"fleetIdle"}

var fleetIdleStage = stage{
	key: "fleet-idle", optIn: true, figures: []anyFigure{fleetIdleFig},
	steps: one("idle fleet: commands/s, RSS per outbox, first-event wait", (*bench).fleetIdle),
	rows:  fleetIdleRows, targets: fleetIdleTargets,
}

func fleetIdleRows(r *Results, add addRow) {
	f, ok := fleetIdleFig.get(r)
	if !ok {
		return
	}
	for _, run := range f.Runs {
		result := fmt.Sprintf("%.1f commands/s, %.3f per outbox (%s), %.2f claim reads/s; RSS %.1f MB, %.2f MB per outbox; first event after %.0f s idle: %.0f ms (polling)",
			run.CommandsS, run.CommandsPerBoxS, describeRates(run.ByCommand), run.ClaimReadsS, run.RSSMB, run.RSSPerBoxMB,
			(fleetIdleSettle + fleetIdleWindow).Seconds(), run.FirstEventMs)
		if run.Error != "" {
			result += "; " + run.Error
		}
		target := ""
		if run.Name == "defaults" {
			target = "fleet idle commands"
		}
		add(fmt.Sprintf("Idle fleet, %d outboxes in %d databases, one replica, %s", run.Outboxes, run.Databases, run.Name), result, target)
	}
}

func fleetIdleTargets(r *Results, add addTarget) {
	f, ok := fleetIdleFig.get(r)
	if !ok {
		return
	}
	for _, run := range f.Runs {
		if run.Name != "defaults" || run.Error != "" {
			continue
		}
		add("fleet idle commands", "<= 20 commands/s", fmt.Sprintf("%.1f commands/s", run.CommandsS), run.CommandsS <= 20)
		add("fleet idle memory", "<= 1 MB per outbox", fmt.Sprintf("%.2f MB per outbox", run.RSSPerBoxMB), run.RSSPerBoxMB <= 1)
	}
}

// describeRates lists rates by name, largest first.
func describeRates(rates map[string]float64) string {
	type kv struct {
		k string
		v float64
	}
	var all []kv
	for k, v := range rates {
		all = append(all, kv{k, v})
	}
	for i := range all { // few entries: insertion sort
		for j := i; j > 0 && all[j].v > all[j-1].v; j-- {
			all[j], all[j-1] = all[j-1], all[j]
		}
	}
	parts := make([]string, len(all))
	for i, e := range all {
		parts[i] = fmt.Sprintf("%s %.2f", e.k, e.v)
	}
	return strings.Join(parts, ", ")
}
