package ferret

import (
	"context"
	"errors"
	"fmt"
	"net/url"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/outbox/internal/redact"
)

// PostgreSQL error codes handled by EnsurePostgresDatabase.
const (
	pgInvalidCatalogName = "3D000" // database does not exist
	pgDuplicateDatabase  = "42P04" // CREATE DATABASE lost a race
	pgUniqueViolation    = "23505" // same race, caught by pg_database's index
)

// maintenanceDatabase is the database EnsurePostgresDatabase connects to in
// order to create another one. It exists in every default cluster.
const maintenanceDatabase = "postgres"

// EnsurePostgresDatabase creates the database named in pgURL (a
// postgres:// URL) when it does not exist yet, connecting to the
// "postgres" maintenance database of the same server with the same
// credentials. It is safe to call concurrently from several processes.
//
// The error says whether the server could not be reached, so that callers can
// tell users to start PostgreSQL.
func EnsurePostgresDatabase(ctx context.Context, pgURL string) error {
	cfg, err := pgx.ParseConfig(pgURL)
	if err != nil {
		return fmt.Errorf("parse PostgreSQL URL %s: %w", redact.URL(pgURL), err)
	}
	name := cfg.Database
	if name == "" {
		return fmt.Errorf("PostgreSQL URL %s names no database", redact.URL(pgURL))
	}

	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err == nil {
		return conn.Close(ctx)
	}
	if !hasCode(err, pgInvalidCatalogName) {
		return fmt.Errorf("connect to PostgreSQL at %s: %w", redact.URL(pgURL), err)
	}

	admin := cfg.Copy()
	admin.Database = maintenanceDatabase
	conn, err = pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL database %q at %s:%d: %w", maintenanceDatabase, cfg.Host, cfg.Port, err)
	}
	defer conn.Close(ctx) //nolint:errcheck // nothing to do about a failed close.

	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	if err != nil && !hasCode(err, pgDuplicateDatabase, pgUniqueViolation) {
		return fmt.Errorf("create PostgreSQL database %q: %w", name, err)
	}
	return nil
}

// WithDatabase returns the postgres:// URL pgURL with its database replaced
// by name.
func WithDatabase(pgURL, name string) (string, error) {
	u, err := url.Parse(pgURL)
	if err != nil {
		return "", fmt.Errorf("parse PostgreSQL URL: %w", err)
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return "", fmt.Errorf("PostgreSQL URL %s: want scheme postgres:// or postgresql://", redact.URL(pgURL))
	}
	u.Path = "/" + name
	u.RawPath = ""
	return u.String(), nil
}

func hasCode(err error, codes ...string) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	for _, c := range codes {
		if pgErr.Code == c {
			return true
		}
	}
	return false
}
