package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox/internal/redact"
)

// pgLockKey is the key of the advisory lock a run holds on its PostgreSQL
// database ("outbox" in ASCII). Advisory locks are per database, so runs
// on different databases never wait for each other.
const pgLockKey int64 = 0x6f7574626f78

// lockPostgres takes the run's lock on the PostgreSQL database behind the
// embedded FerretDB, and holds it until release. Two runs on one database
// would drop each other's collections (a run starts by dropping its
// database, and each stage its collections) and both report figures of
// nothing in particular; the second run stops at once instead, saying so.
// The lock is a session lock: it ends with its connection, also when the
// process is killed.
func lockPostgres(ctx context.Context, pgURL string) (release func(), err error) {
	conn, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL at %s: %w", redact.URL(pgURL), err)
	}
	var locked bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", pgLockKey).Scan(&locked); err != nil {
		_ = conn.Close(ctx)
		return nil, fmt.Errorf("lock PostgreSQL database %q: %w", conn.Config().Database, err)
	}
	if !locked {
		_ = conn.Close(ctx)
		return nil, fmt.Errorf("another bench run is using PostgreSQL database %q, and two runs drop each other's collections: "+
			"wait for it to end, or give this run a database of its own with -postgres-url", conn.Config().Database)
	}
	return func() { _ = conn.Close(context.Background()) }, nil
}
