package testenv

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox/internal/ferret"
)

// PostgresDatabase creates a PostgreSQL database of this test's own on the
// server of PostgresURL, named by UniqueName(t, prefix), and returns its
// URL and name. It is dropped in t.Cleanup, connections still open to it
// or not. If PostgreSQL is unreachable, the test fails saying so.
func PostgresDatabase(t testing.TB, prefix string) (url, name string) {
	t.Helper()
	admin := PostgresURL()
	name = UniqueName(t, prefix)
	url, err := ferret.WithDatabase(admin, name)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if err := ferret.EnsurePostgresDatabase(t.Context(), url); err != nil {
		t.Fatalf("testenv: %v (start PostgreSQL with: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start)", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Errorf("testenv: drop PostgreSQL database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx) //nolint:errcheck // nothing to do about a failed close.
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("testenv: drop PostgreSQL database %s: %v", name, err)
		}
	})
	return url, name
}
