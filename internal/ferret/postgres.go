package ferret

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
		return fmt.Errorf("parse PostgreSQL URL %s: %w", RedactURL(pgURL), err)
	}
	name := cfg.Database
	if name == "" {
		return fmt.Errorf("PostgreSQL URL %s names no database", RedactURL(pgURL))
	}

	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err == nil {
		return conn.Close(ctx)
	}
	if !hasCode(err, pgInvalidCatalogName) {
		return fmt.Errorf("connect to PostgreSQL at %s: %w", RedactURL(pgURL), err)
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
		return "", fmt.Errorf("PostgreSQL URL %s: want scheme postgres:// or postgresql://", RedactURL(pgURL))
	}
	u.Path = "/" + name
	u.RawPath = ""
	return u.String(), nil
}

// RedactURL returns rawURL with its password, if any, replaced by "xxxxx".
// Strings that are not URLs are returned with everything after the scheme
// hidden, since they may hold a password in another syntax.
func RedactURL(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme == "" {
		if i := strings.Index(rawURL, "://"); i > 0 {
			return rawURL[:i+3] + "(redacted)"
		}
		return "(redacted)"
	}
	return u.Redacted()
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
