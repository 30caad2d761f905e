package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/broker"
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
	now := time.Now().UTC()
	st, err := store.Stats(ctx, now.Add(-cfg.StaleAfter))
	if err != nil {
		return err
	}
	if asJSON {
		out := map[string]any{
			"counts":              st.Counts,
			"oldestNewAgeSeconds": st.OldestNewAge(now).Seconds(),
			"staleProcessing":     st.Stale,
			"staleAfterSeconds":   cfg.StaleAfter.Seconds(),
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

// requeueCommand is `worker requeue`.
func requeueCommand(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	var (
		f      mongo.RequeueFilter
		ids    listFlag
		dryRun bool
	)
	cfg, _, err := loadConfig("requeue", args, getenv, true, func(fs *flag.FlagSet) {
		fs.Var(&ids, "id", "event _id to requeue (repeatable)")
		fs.StringVar(&f.Type, "type", "", "requeue FAILED events of this type")
		fs.BoolVar(&f.All, "all", false, "requeue every FAILED event")
		fs.BoolVar(&dryRun, "dry-run", false, "only count what would be requeued")
	})
	if err != nil {
		return err
	}
	f.IDs = ids
	if len(f.IDs) == 0 && f.Type == "" && !f.All {
		return fmt.Errorf("%w: requeue needs --id, --type or --all", ErrUsage)
	}
	ctx, cancel := context.WithTimeout(ctx, toolTimeout)
	defer cancel()
	store, closeFn, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer closeFn()
	n, err := store.Requeue(ctx, f, dryRun)
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
