// Command bench measures the relay on the local stack and prints one table:
// the raw broker and database limits, the worker (bin/worker, as separate
// processes) draining a backlog with 1, 2 and 4 replicas, with ordering on
// and off, its database commands, CPU and memory per event, and the
// stages listed in stages.go: one aggregate's backlog, latency, the
// claim's cost, retention, held aggregates, large documents, the inbox
// consumer and the relay on a slow database or a large backlog. Each
// stage is a value that owns its steps, its figures in bench.json, its
// rows of the table and its targets (stage.go). It writes
// results/bench.json, bench.txt and bench.png.
//
// By default it runs FerretDB embedded (PostgreSQL backend) on a TCP port
// the worker processes can reach; with -mongo-uri (or
// OUTBOX_BENCH_MONGO_URI) it runs against that MongoDB instead. See
// docs/performance.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	driver "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/internal/ferret"
	"github.com/outboxrelay/outbox/internal/redact"
)

// config is the harness's settings; every one is a flag.
type config struct {
	MongoURI     string
	PostgresURL  string
	AMQPURL      string
	WorkerBin    string
	OutDir       string
	Backlog      int
	BatchSize    int
	Replicas     []int
	DrainSched   string
	BrokerMsgs   int
	PublishMsgs  int
	LatencyRate  float64
	LatencyFor   time.Duration
	ClaimNew     int
	HotEvents    int
	SkewEvents   int
	ClaimRuns    int
	Published    int
	InsertBudget time.Duration
	Profile      bool
	// SelfProfile is -self-profile: a CPU profile of this process, where
	// the embedded FerretDB decodes and sorts what every loop reads.
	SelfProfile string
	Budget      time.Duration
	Replot      string
	Doc         string
	WorkerEnv   []string
	Only        map[string]bool

	// RetentionEvents is the PUBLISHED history of the retention stage.
	RetentionEvents int
	// LatencyBacklog is the backlog of the slow-database latency stages.
	LatencyBacklog int
	// PausedHead, HeldHead and StarveHealthy size the starvation stages;
	// StarveTimeout bounds their healthy phase.
	PausedHead    int
	HeldHead      int
	StarveHealthy int
	StarveTimeout time.Duration
	// FleetOutboxes and FleetDatabases size the fleet stages' fleet file.
	FleetOutboxes  int
	FleetDatabases int
	// FleetVariants, when set, are the only fleet-idle runs made, by name.
	FleetVariants []string
	// FairFlood is the backlog the fleet-fair stage floods one outbox with.
	FairFlood int
	// FairRate is the events/s each steady outbox of fleet-fair is written.
	FairRate float64
	// FairDrainMax bounds the wait for fleet-fair's flood to drain.
	FairDrainMax time.Duration
	// Baseline is a second worker binary (an earlier build) that the slow
	// stages run too, for before/after figures from the same run.
	Baseline string
}

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	stopProfile, err := startSelfProfile(cfg.SelfProfile)
	if err == nil {
		err = run(ctx, cfg, os.Stdout)
		err = errors.Join(err, stopProfile())
	}
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// startSelfProfile starts a CPU profile of this process into path, and
// returns the function that ends it; with no path it does nothing.
func startSelfProfile(path string) (func() error, error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("-self-profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("-self-profile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}

func parseFlags(args []string, getenv func(string) string) (config, error) {
	var c config
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.StringVar(&c.MongoURI, "mongo-uri", getenv("OUTBOX_BENCH_MONGO_URI"), "MongoDB to measure (env OUTBOX_BENCH_MONGO_URI); empty runs embedded FerretDB")
	fs.StringVar(&c.PostgresURL, "postgres-url", "postgres://postgres@127.0.0.1:5432/outbox_bench", "PostgreSQL database of the embedded FerretDB; created if missing, and held by one run at a time")
	fs.StringVar(&c.AMQPURL, "amqp-url", envOr(getenv, "OUTBOX_BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ (env OUTBOX_BENCH_AMQP_URL)")
	fs.StringVar(&c.WorkerBin, "worker", "bin/worker", "worker binary (make build)")
	fs.StringVar(&c.OutDir, "out", "results", "folder for bench.json, bench.txt, bench.png and raw/")
	fs.IntVar(&c.Backlog, "backlog", 0, "events in the backlog of the raw database loop and of each replica run; 0 means 20,000 on MongoDB and 10,000 on FerretDB (see docs/performance.md)")
	fs.IntVar(&c.BatchSize, "batch-size", 500, "events per claim, for the worker and the raw loop")
	replicas := fs.String("replicas", "1,2,3,4", "replica counts of the drain runs (3 against 1 is the scaling target)")
	fs.StringVar(&c.DrainSched, "drain-schedule", "@every 100ms", "OUTBOX_CLAIM_SCHEDULE of the drain runs")
	fs.IntVar(&c.BrokerMsgs, "broker-messages", 50000, "messages of the raw broker run")
	fs.IntVar(&c.PublishMsgs, "publish-messages", 50000, "messages of the publish stage (batches of -batch-size)")
	fs.Float64Var(&c.LatencyRate, "latency-rate", 50, "events/s written during the latency runs")
	fs.DurationVar(&c.LatencyFor, "latency-for", 20*time.Second, "length of each latency run")
	fs.IntVar(&c.HotEvents, "hot-events", 10000, "events of the single aggregate of the hot-aggregate stage")
	fs.IntVar(&c.SkewEvents, "skew-events", 400, "versions of the one aggregate the skewed-producers stage's two producers write")
	fs.IntVar(&c.ClaimNew, "claim-new", 2000, "NEW events in the collection when claim latency is measured")
	fs.IntVar(&c.ClaimRuns, "claim-runs", 7, "claims per claim-latency figure (the median is reported)")
	fs.IntVar(&c.Published, "published", 200000, "PUBLISHED events inserted for the second claim-latency figure")
	fs.IntVar(&c.RetentionEvents, "retention-events", 20000, "PUBLISHED events, older than the retention period, that the retention stage deletes")
	fs.DurationVar(&c.InsertBudget, "insert-budget", 100*time.Second, "most time spent inserting those PUBLISHED events; fewer are used if it runs out")
	fs.BoolVar(&c.Profile, "profile", true, "CPU-profile the 1-replica worker during its drain (raw/worker-x1.cpu.prof)")
	fs.StringVar(&c.SelfProfile, "self-profile", "", "write a CPU profile of the whole run of this process, the embedded FerretDB's side of every loop, to this file")
	fs.DurationVar(&c.Budget, "budget", 10*time.Minute, "time for the whole run; the PUBLISHED insert of the claim stage stops early to keep within it")
	fs.StringVar(&c.Replot, "replot", "", "read this bench.json and only rewrite the table and chart next to it (no measurements)")
	fs.StringVar(&c.Doc, "doc", "", "also rewrite the generated table in this document (make bench: docs/performance.md)")
	fs.IntVar(&c.LatencyBacklog, "db-latency-backlog", 3000, "events of each slow-database latency stage (db-latency-100ms, db-latency-600ms)")
	fs.IntVar(&c.PausedHead, "paused-head", 50000, "NEW events of a paused type at the head in the paused-head stage")
	fs.IntVar(&c.HeldHead, "held-head", 5000, "aggregates held by a FAILED event, each with 5 NEW events waiting, at the head in the held-head stage")
	fs.IntVar(&c.StarveHealthy, "starve-healthy", 400, "healthy events behind the head in the starvation stages, one to an aggregate")
	fs.DurationVar(&c.StarveTimeout, "starve-timeout", 3*time.Minute, "time the starvation stages' replicas have to publish the healthy events")
	fs.StringVar(&c.Baseline, "baseline", "", "a second worker binary, e.g. the starting commit's build, that the slow-database stages (db-latency-*, backlog-*), held-aggregates, large-docs and the starvation stages (paused-head, held-head) also run, reported beside -worker's (make bench BASELINE=<git rev>)")
	fs.IntVar(&c.FleetOutboxes, "fleet-outboxes", envInt(getenv, "OUTBOX_BENCH_FLEET_OUTBOXES", 200), "outboxes of the fleet-idle stage (env OUTBOX_BENCH_FLEET_OUTBOXES)")
	fs.IntVar(&c.FleetDatabases, "fleet-databases", envInt(getenv, "OUTBOX_BENCH_FLEET_DATABASES", 20), "databases the fleet-idle stage's outboxes are spread over (env OUTBOX_BENCH_FLEET_DATABASES)")
	fs.IntVar(&c.FairFlood, "fair-flood", envInt(getenv, "OUTBOX_BENCH_FAIR_FLOOD", 5000), "events the fleet-fair stage floods one outbox with at once (env OUTBOX_BENCH_FAIR_FLOOD; the issue's 100,000 takes over 15 minutes to drain on FerretDB)")
	fs.Float64Var(&c.FairRate, "fair-rate", envFloat(getenv, "OUTBOX_BENCH_FAIR_RATE", 5), "events/s written to each steady outbox of the fleet-fair stage (env OUTBOX_BENCH_FAIR_RATE)")
	fs.DurationVar(&c.FairDrainMax, "fair-drain-max", 10*time.Minute, "longest wait for the fleet-fair flood to drain; a flood that has not is reported with how far it got")
	fleetVariants := fs.String("fleet-idle-runs", getenv("OUTBOX_BENCH_FLEET_IDLE_RUNS"), "comma-separated names of the fleet-idle runs to make (defaults, no idle back-off, stale threshold 10m); empty makes all (env OUTBOX_BENCH_FLEET_IDLE_RUNS)")
	workerEnv := fs.String("worker-env", "", "extra environment of the worker processes, comma-separated KEY=VALUE (e.g. GOMAXPROCS=1)")
	only := fs.String("only", "", "comma-separated stages to run ("+strings.Join(stageKeys(stages()), ", ")+"); empty runs all but the opt-in "+strings.Join(optInKeys(stages()), " and "))
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, s := range strings.Split(*replicas, ",") {
		var n int
		if _, err := fmt.Sscan(strings.TrimSpace(s), &n); err != nil || n < 1 || n > 16 {
			return config{}, fmt.Errorf("-replicas %q: want a list of counts from 1 to 16", *replicas)
		}
		c.Replicas = append(c.Replicas, n)
	}
	if *fleetVariants != "" {
		for _, v := range strings.Split(*fleetVariants, ",") {
			c.FleetVariants = append(c.FleetVariants, strings.TrimSpace(v))
		}
	}
	if *workerEnv != "" {
		for _, kv := range strings.Split(*workerEnv, ",") {
			if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
				return config{}, fmt.Errorf("-worker-env %q: want KEY=VALUE pairs separated by commas", *workerEnv)
			}
			c.WorkerEnv = append(c.WorkerEnv, strings.TrimSpace(kv))
		}
	}
	var err error
	if c.Only, err = parseOnly(*only, stages()); err != nil {
		return config{}, err
	}
	switch {
	case c.Backlog != 0 && c.Backlog < c.BatchSize:
		return config{}, fmt.Errorf("-backlog %d: want at least -batch-size (%d)", c.Backlog, c.BatchSize)
	case c.BatchSize < 1 || c.BatchSize > 10000:
		return config{}, fmt.Errorf("-batch-size %d: want 1 to 10000", c.BatchSize)
	case c.LatencyRate <= 0 || c.LatencyFor <= 0:
		return config{}, errors.New("-latency-rate and -latency-for must be positive")
	case c.HotEvents < 1:
		return config{}, fmt.Errorf("-hot-events %d: want at least 1", c.HotEvents)
	case c.SkewEvents < 2:
		return config{}, fmt.Errorf("-skew-events %d: want at least 2", c.SkewEvents)
	case c.LatencyBacklog < 1:
		return config{}, fmt.Errorf("-db-latency-backlog %d: want at least 1", c.LatencyBacklog)
	case c.PausedHead < 1 || c.HeldHead < 1 || c.StarveHealthy < starveReplicas || c.StarveHealthy > 99999 || c.StarveTimeout <= 0:
		return config{}, fmt.Errorf("-paused-head %d, -held-head %d, -starve-healthy %d, -starve-timeout %s: want heads of at least 1, %d to 99,999 healthy events and a positive timeout",
			c.PausedHead, c.HeldHead, c.StarveHealthy, c.StarveTimeout, starveReplicas)
	case c.FleetOutboxes < 1 || c.FleetDatabases < 1 || c.FleetDatabases > c.FleetOutboxes || c.FleetOutboxes > 999:
		return config{}, fmt.Errorf("-fleet-outboxes %d, -fleet-databases %d: want 1 to 999 outboxes over 1 to as many databases", c.FleetOutboxes, c.FleetDatabases)
	case c.FairFlood < 1 || c.FairRate <= 0 || c.FairDrainMax <= 0:
		return config{}, fmt.Errorf("-fair-flood %d, -fair-rate %g: want at least 1 event and a rate above 0", c.FairFlood, c.FairRate)
	case c.RetentionEvents < 1:
		return config{}, fmt.Errorf("-retention-events %d: want at least 1", c.RetentionEvents)
	case c.ClaimNew < c.BatchSize || c.ClaimRuns < 1:
		return config{}, fmt.Errorf("-claim-new %d must be at least -batch-size and -claim-runs at least 1", c.ClaimNew)
	}
	return c, nil
}

// envInt is key's integer, or def when it is unset or not a number
// (the flag's own check then reports a bad one).
func envInt(getenv func(string) string, key string, def int) int {
	if n, err := strconv.Atoi(getenv(key)); err == nil {
		return n
	}
	return def
}

// envFloat is key's number, or def when it is unset or not a number.
func envFloat(getenv func(string) string, key string, def float64) float64 {
	if n, err := strconv.ParseFloat(getenv(key), 64); err == nil {
		return n
	}
	return def
}

func envOr(getenv func(string) string, key, def string) string {
	if v := getenv(key); v != "" {
		return v
	}
	return def
}

// bench is one run of the harness: its settings, servers and clients,
// which the stages' steps measure with, and the results they write.
type bench struct {
	cfg      config
	out      io.Writer
	logger   *slog.Logger
	mongoURI string // what the worker processes connect to
	ferret   bool
	client   *driver.Client
	db       *driver.Database
	rawDir   string
	res      *Results
	started  time.Time
	unlock   func() // ends the run's hold on its PostgreSQL database
}

// Default backlogs: 20,000 on MongoDB; half that on FerretDB,
// where a drain of 20,000 takes 170 to 230 s on two cores.
const (
	backlogMongoDB  = 20000
	backlogFerretDB = 10000
)

// databaseName is the database every stage works in; each stage uses its
// own collections and drops them when done.
const databaseName = "outbox_bench"

func run(ctx context.Context, cfg config, out io.Writer) error {
	if cfg.Replot != "" {
		return replot(cfg.Replot, cfg.Doc, out)
	}
	started := time.Now()
	b := &bench{
		cfg:     cfg,
		out:     out,
		logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		rawDir:  filepath.Join(cfg.OutDir, "raw"),
		res:     &Results{StartedAt: started.UTC()},
		started: started,
	}
	if err := os.MkdirAll(b.rawDir, 0o755); err != nil {
		return err
	}
	if _, err := os.Stat(cfg.WorkerBin); err != nil {
		return fmt.Errorf("worker binary: %w (run make build)", err)
	}
	if cfg.Baseline != "" {
		if _, err := os.Stat(cfg.Baseline); err != nil {
			return fmt.Errorf("baseline worker binary: %w", err)
		}
	}
	if err := runStep(ctx, step{"setup", b.setup}, b.res, out); err != nil {
		return err
	}
	defer b.teardown()
	b.res.Config = b.cfg.summary()

	if err := runStages(ctx, b, stages(), cfg.Only, b.res, out); err != nil {
		return err
	}
	b.res.TotalSeconds = time.Since(started).Seconds()
	b.res.evaluate(stages())
	return b.report()
}

// setup starts FerretDB unless a MongoDB URI was given, connects the
// harness's client and records the machine.
func (b *bench) setup(ctx context.Context) error {
	b.mongoURI = b.cfg.MongoURI
	if b.mongoURI == "" {
		b.ferret = true
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := ferret.EnsurePostgresDatabase(sctx, b.cfg.PostgresURL); err != nil {
			return fmt.Errorf("%w\nstart PostgreSQL with: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start", err)
		}
		unlock, err := lockPostgres(sctx, b.cfg.PostgresURL)
		if err != nil {
			return err
		}
		b.unlock = unlock
		// FerretDB lives as long as the harness; the worker processes
		// reach it over TCP.
		logger := ferret.NewLogger(os.Stderr, slog.LevelError)
		uri, err := ferret.Start(context.WithoutCancel(ctx), "127.0.0.1:0", b.cfg.PostgresURL, logger)
		if err != nil {
			return err
		}
		b.mongoURI = uri
	}
	client, err := driver.Connect(options.Client().ApplyURI(b.mongoURI).SetMaxPoolSize(20).SetAppName("outbox-bench"))
	if err != nil {
		return fmt.Errorf("connect to %s: %w", redact.URL(b.mongoURI), err)
	}
	b.client = client
	b.db = client.Database(databaseName)
	if err := client.Ping(ctx, nil); err != nil {
		return fmt.Errorf("ping %s: %w", redact.URL(b.mongoURI), err)
	}
	// Leftovers of an interrupted run would change every figure.
	if err := b.db.Drop(ctx); err != nil {
		return fmt.Errorf("drop database %s: %w", databaseName, err)
	}
	b.res.Machine = b.machine(ctx)
	if b.cfg.Backlog == 0 {
		b.cfg.Backlog = backlogMongoDB
		if b.ferret {
			b.cfg.Backlog = backlogFerretDB
			fmt.Fprintf(b.out, "   backlog %d: FerretDB reads every NEW event on each claim, so a drain costs about\n"+
				"   the square of the backlog; 20,000 takes 3 to 4 minutes per run here and four runs do not fit\n"+
				"   the 10-minute budget (-backlog 20000 to insist)\n", b.cfg.Backlog)
		}
	}
	fmt.Fprintf(b.out, "   database %s (%s), broker %s\n", redact.URL(b.mongoURI), b.res.Machine.Database, redact.URL(b.cfg.AMQPURL))
	return nil
}

func (b *bench) teardown() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if b.db != nil {
		_ = b.db.Drop(ctx)
	}
	if b.client != nil {
		_ = b.client.Disconnect(ctx)
	}
	if b.unlock != nil {
		b.unlock()
	}
}

// collection returns a fresh collection for a stage, dropping any
// leftover of the same name.
func (b *bench) collection(ctx context.Context, name string) (*driver.Collection, error) {
	coll := b.db.Collection(name)
	if err := coll.Drop(ctx); err != nil {
		return nil, fmt.Errorf("drop %s: %w", name, err)
	}
	return coll, nil
}

func dropQuietly(coll *driver.Collection) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = coll.Drop(ctx)
}
