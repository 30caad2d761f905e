package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/internal/redact"
	"github.com/outboxrelay/outbox/mongo"
)

// toolTimeout bounds an operator command, the wait for the database
// included (docs/operations.md says so).
const toolTimeout = 60 * time.Second

// toolPatience is how long an operator command waits for the database in
// silence: past it, it says on stderr what it is waiting for and until
// when, rather than look hung.
const toolPatience = 2 * time.Second

// openStore connects for an operator command, bounded by toolTimeout,
// and returns the command's context, the store and a function that
// disconnects and releases the context. A wait for the database longer
// than toolPatience is told on stderr.
func openStore(ctx context.Context, cfg Config, stderr io.Writer) (context.Context, *mongo.Store, func(), error) {
	// Server selection waits the whole command's time, not the driver's
	// 30 s: one limit, the documented one.
	client, err := driver.Connect(mongoClientOptions(cfg, connectionName("outbox-worker-cli", "")).SetServerSelectionTimeout(toolTimeout))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%w: invalid OUTBOX_MONGO_URI %q: %v", ErrUsage, redact.URL(cfg.MongoURI), err)
	}
	ctx, cancel := context.WithTimeout(ctx, toolTimeout)
	closeFn := func() {
		_ = client.Disconnect(context.WithoutCancel(ctx))
		cancel()
	}
	store := mongo.New(client, mongoStoreConfig(cfg, nil))
	notice := time.AfterFunc(toolPatience, func() {
		fmt.Fprintf(stderr, "waiting for MongoDB at %s (giving up after %s)...\n", redact.URL(cfg.MongoURI), toolTimeout)
	})
	err = store.Ping(ctx)
	notice.Stop()
	if err != nil {
		closeFn()
		return nil, nil, nil, fmt.Errorf("connect to %s: %w", redact.URL(cfg.MongoURI), err)
	}
	return ctx, store, closeFn, nil
}

// startOperator is how an operator command starts: it reads the
// settings and the command's own flags (flags defines them), has check
// refuse a bad use of the flags (nil checks nothing), and only then
// opens the store as openStore does, so that a usage error is told at
// once rather than after the wait for a database. The caller defers
// closeFn. (requeue, whose checks read a file and the terminal, calls
// loadConfig and openStore itself.)
func startOperator(ctx context.Context, name string, args []string, getenv func(string) string, stderr io.Writer,
	flags func(*flag.FlagSet), check func() error) (context.Context, Config, *mongo.Store, func(), error) {
	cfg, _, err := loadConfig(name, args, getenv, operatorCommand, flags)
	if err != nil {
		return nil, Config{}, nil, nil, err
	}
	if check != nil {
		if err := check(); err != nil {
			return nil, Config{}, nil, nil, err
		}
	}
	ctx, store, closeFn, err := openStore(ctx, cfg, stderr)
	return ctx, cfg, store, closeFn, err
}

// serverNow is the database server's time, so that `worker stats` reports
// the same ages as the workers' /status and metrics whatever the clock of
// the machine it runs on says; the local time if it cannot be read.
func serverNow(ctx context.Context, store *mongo.Store) time.Time {
	clock := mongo.NewClock(store.Collection().Database().Client(), slog.New(slog.DiscardHandler))
	_ = clock.Sync(ctx) // on failure Now is the local time
	return clock.Now().UTC()
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

// namedEvents are the flags of the commands that change the events an
// operator names (requeue, skip, discard): --id, repeatable, and --dry-run.
type namedEvents struct {
	ids    listFlag
	dryRun bool
}

// define adds the flags to fs: idUsage says what an id names, and done
// what a dry run counts ("requeued").
func (n *namedEvents) define(fs *flag.FlagSet, idUsage, done string) {
	fs.Var(&n.ids, "id", idUsage)
	fs.BoolVar(&n.dryRun, "dry-run", false, "only count what would be "+done)
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
