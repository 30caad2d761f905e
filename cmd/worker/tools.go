package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/broker"
	"github.com/outboxrelay/outbox/claim"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

// toolTimeout bounds an operator command.
const toolTimeout = 60 * time.Second

// openStore connects for an operator command and returns the store and a
// function that disconnects.
func openStore(ctx context.Context, cfg Config) (*mongo.Store, func(), error) {
	client, err := driver.Connect(mongoClientOptions(cfg, "outbox-worker-cli"))
	if err != nil {
		return nil, nil, fmt.Errorf("%w: invalid OUTBOX_MONGO_URI %q: %v", ErrUsage, broker.Redact(cfg.MongoURI), err)
	}
	closeFn := func() { _ = client.Disconnect(context.WithoutCancel(ctx)) }
	store := mongo.New(client, mongoStoreConfig(cfg, nil))
	if err := store.Ping(ctx); err != nil {
		closeFn()
		return nil, nil, fmt.Errorf("connect to %s: %w", broker.Redact(cfg.MongoURI), err)
	}
	return store, closeFn, nil
}

// serverNow is the database server's time, so that `worker stats` reports
// the same ages as the workers' /status and metrics whatever the clock of
// the machine it runs on says; the local time if it cannot be read.
func serverNow(ctx context.Context, store *mongo.Store) time.Time {
	clock := mongo.NewClock(store.Collection().Database().Client(), slog.New(slog.DiscardHandler))
	_ = clock.Sync(ctx) // on failure Now is the local time
	return clock.Now().UTC()
}

// statsCommand is `worker stats`.
func statsCommand(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	var asJSON bool
	cfg, _, err := loadConfig("stats", args, getenv, true, func(fs *flag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print JSON")
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, toolTimeout)
	defer cancel()
	store, closeFn, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer closeFn()
	now := serverNow(ctx, store)
	st, err := store.Stats(ctx, now.Add(-cfg.StaleAfter))
	if err != nil {
		return err
	}
	held, err := store.Held(ctx, now, cfg.OrderingAfterFailed == claim.AfterFailedWait)
	if err != nil {
		return err
	}
	if asJSON {
		out := map[string]any{
			"counts":               st.Counts,
			"oldestNewAgeSeconds":  st.OldestNewAge(now).Seconds(),
			"staleProcessing":      st.Stale,
			"staleAfterSeconds":    cfg.StaleAfter.Seconds(),
			"heldAggregates":       held.Aggregates,
			"oldestHeldAgeSeconds": held.OldestAge(now).Seconds(),
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STATUS\tEVENTS")
	for _, s := range events.Statuses {
		fmt.Fprintf(tw, "%s\t%d\n", s, st.Counts[s])
	}
	fmt.Fprintln(tw)
	fmt.Fprintf(tw, "oldest NEW event\t%s\n", ageOrNone(st.OldestNewAge(now), st.OldestNew.IsZero()))
	fmt.Fprintf(tw, "stale PROCESSING (older than %s)\t%d\n", cfg.StaleAfter, st.Stale)
	fmt.Fprintf(tw, "held aggregates\t%d\n", held.Aggregates)
	fmt.Fprintf(tw, "oldest held event\t%s\n", ageOrNone(held.OldestAge(now), held.OldestWaiting.IsZero()))
	return tw.Flush()
}

func ageOrNone(age time.Duration, none bool) string {
	if none {
		return "none"
	}
	return age.Round(time.Millisecond).String() + " old"
}

// listFlag collects a repeatable string flag; commas separate values too.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

// stdin is what `--ids-from -` reads; a variable so that a test can give
// the command its input.
var stdin io.Reader = os.Stdin

// requeueChunk is how many ids one requeue command names, so that a long
// list read from a file stays far below MongoDB's 16 MiB command limit.
const requeueChunk = 1000

// readIDs reads one id per line from path, or from standard input when
// path is "-". A line is the id exactly, commas and spaces included; only
// its line ending (\n or \r\n) is dropped, and empty lines are skipped.
func readIDs(path string) ([]string, error) {
	r := stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("%w: --ids-from: %v", ErrUsage, err)
		}
		defer f.Close()
		r = f
	}
	var ids []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if id := strings.TrimSuffix(sc.Text(), "\r"); id != "" {
			ids = append(ids, id)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read ids from %s: %w", path, err)
	}
	return ids, nil
}

// requeueCommand is `worker requeue`.
func requeueCommand(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	var (
		f       mongo.RequeueFilter
		ids     listFlag
		idsFrom string
		dryRun  bool
	)
	cfg, _, err := loadConfig("requeue", args, getenv, true, func(fs *flag.FlagSet) {
		fs.Var(&ids, "id", "event _id to requeue (repeatable; commas separate ids)")
		fs.StringVar(&idsFrom, "ids-from", "", "file of event _ids to requeue, one per line, exactly (commas and spaces are part of an id); - reads standard input")
		fs.StringVar(&f.Type, "type", "", "requeue FAILED events of this type")
		fs.BoolVar(&f.All, "all", false, "requeue every FAILED event")
		fs.BoolVar(&dryRun, "dry-run", false, "only count what would be requeued")
	})
	if err != nil {
		return err
	}
	f.IDs = ids
	if idsFrom != "" {
		more, err := readIDs(idsFrom)
		if err != nil {
			return err
		}
		if len(more) == 0 {
			return fmt.Errorf("%w: --ids-from %s holds no id", ErrUsage, idsFrom)
		}
		f.IDs = append(f.IDs, more...)
	}
	if len(f.IDs) == 0 && f.Type == "" && !f.All {
		return fmt.Errorf("%w: requeue needs --id, --ids-from, --type or --all", ErrUsage)
	}
	f.IDs = distinct(f.IDs) // an id named twice must not count twice in a dry run
	ctx, cancel := context.WithTimeout(ctx, toolTimeout)
	defer cancel()
	store, closeFn, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer closeFn()
	n, err := requeueInChunks(ctx, store, f, dryRun)
	if err != nil {
		return err
	}
	if dryRun {
		fmt.Fprintf(stdout, "%d FAILED events would be requeued\n", n)
		return nil
	}
	fmt.Fprintf(stdout, "requeued %d FAILED events to NEW\n", n)
	return nil
}

// distinct returns ids without repeats, in their first order.
func distinct(ids []string) []string {
	seen := make(map[string]bool, len(ids))
	out := ids[:0:0]
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

// requeueInChunks requeues what f chooses, its ids requeueChunk at a time.
func requeueInChunks(ctx context.Context, store *mongo.Store, f mongo.RequeueFilter, dryRun bool) (int, error) {
	if len(f.IDs) == 0 {
		return store.Requeue(ctx, f, dryRun)
	}
	all, total := f.IDs, 0
	for chunk := range slices.Chunk(all, requeueChunk) {
		f.IDs = chunk
		n, err := store.Requeue(ctx, f, dryRun)
		total += n
		if err != nil {
			return total, fmt.Errorf("after %d requeued: %w", total, err)
		}
	}
	return total, nil
}

// skipCommand is `worker skip`: it marks FAILED events as skipped by an
// operator, so that the later events of their aggregates flow, and
// records and logs who skipped what, when and why.
func skipCommand(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var (
		ids    listFlag
		by     string
		reason string
		dryRun bool
	)
	cfg, _, err := loadConfig("skip", args, getenv, true, func(fs *flag.FlagSet) {
		fs.Var(&ids, "id", "FAILED event _id to skip (repeatable; commas separate ids)")
		fs.StringVar(&by, "by", "", "who skips them (recorded as skippedBy)")
		fs.StringVar(&reason, "reason", "", "why (recorded as skipReason)")
		fs.BoolVar(&dryRun, "dry-run", false, "only count what would be skipped")
	})
	if err != nil {
		return err
	}
	switch {
	case len(ids) == 0:
		return fmt.Errorf("%w: skip needs --id", ErrUsage)
	case strings.TrimSpace(by) == "":
		return fmt.Errorf("%w: skip needs --by NAME (who skips)", ErrUsage)
	case strings.TrimSpace(reason) == "":
		return fmt.Errorf("%w: skip needs --reason TEXT (why)", ErrUsage)
	}
	ids = distinct(ids)
	ctx, cancel := context.WithTimeout(ctx, toolTimeout)
	defer cancel()
	store, closeFn, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer closeFn()
	n, err := store.Skip(ctx, ids, by, reason, time.Now(), dryRun)
	if err != nil {
		return err
	}
	if dryRun {
		fmt.Fprintf(stdout, "%d FAILED events would be skipped\n", n)
		return nil
	}
	newLogger(cfg, stderr).Info("FAILED events skipped; later events of their aggregates flow",
		"event_ids", []string(ids), "skipped", n, "skipped_by", by, "skip_reason", reason)
	fmt.Fprintf(stdout, "skipped %d FAILED events (of %d named; events not FAILED or already skipped are left alone)\n", n, len(ids))
	return nil
}

// showCommand is `worker show --id ID`.
func showCommand(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	var id string
	cfg, _, err := loadConfig("show", args, getenv, true, func(fs *flag.FlagSet) {
		fs.StringVar(&id, "id", "", "event _id")
	})
	if err != nil {
		return err
	}
	if id == "" {
		return fmt.Errorf("%w: show needs --id", ErrUsage)
	}
	ctx, cancel := context.WithTimeout(ctx, toolTimeout)
	defer cancel()
	store, closeFn, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer closeFn()
	doc, err := store.Find(ctx, id)
	if err != nil {
		return err
	}
	out, err := bson.MarshalExtJSONIndent(doc, false, false, "", "  ")
	if err != nil {
		return fmt.Errorf("print event %q: %w", id, err)
	}
	_, err = fmt.Fprintf(stdout, "%s\n", out)
	return err
}
