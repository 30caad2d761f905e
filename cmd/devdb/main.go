// Command devdb runs an embedded FerretDB (the MongoDB wire protocol over
// PostgreSQL) for local development on machines without MongoDB. It prints
// the MongoDB URI to use and runs until SIGINT or SIGTERM.
//
// It is a development tool only: FerretDB v1 has no transactions, no change
// streams and no per-document atomicity of filter-and-update under
// concurrency. Never point production at it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/outboxrelay/outbox/internal/ferret"
	"github.com/outboxrelay/outbox/internal/redact"
)

const (
	listenDefault      = "127.0.0.1:27017"
	postgresURLDefault = "postgres://postgres@127.0.0.1:5432/outbox_dev"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "devdb:", err)
		os.Exit(1)
	}
}

func run() error {
	listen := flag.String("listen", listenDefault, "TCP address to serve the MongoDB wire protocol on")
	pgURL := flag.String("postgres-url", postgresURLDefault, "PostgreSQL database that stores the data; created if missing")
	logLevel := flag.String("log-level", "warn", "FerretDB log level: debug, info, warn or error")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", flag.Args())
	}

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level %q: %w", *logLevel, err)
	}
	logger := ferret.NewLogger(os.Stderr, level)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	setupCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err := ferret.EnsurePostgresDatabase(setupCtx, *pgURL)
	cancel()
	if err != nil {
		return fmt.Errorf("%w\nstart PostgreSQL with: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start", err)
	}

	uri, err := ferret.Start(ctx, *listen, *pgURL, logger)
	if err != nil {
		return err
	}
	logger.Info("FerretDB running", "postgres_url", redact.URL(*pgURL))
	fmt.Println(uri)
	fmt.Fprintln(os.Stderr, "devdb: serving MongoDB wire protocol at", uri, "(stop with Ctrl-C)")

	<-ctx.Done()
	fmt.Fprintln(os.Stderr, "devdb: stopping")
	return nil
}
