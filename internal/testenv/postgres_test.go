package testenv

import (
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestPostgresDatabaseIsDroppedAfterItsTest: the database answers during
// its test, a connection left open does not keep it, and it is gone once
// the test's cleanup has run.
func TestPostgresDatabaseIsDroppedAfterItsTest(t *testing.T) {
	t.Parallel()
	var name string
	t.Run("uses it", func(t *testing.T) {
		var url string
		url, name = PostgresDatabase(t, "pg_")
		conn, err := pgx.Connect(t.Context(), url)
		if err != nil {
			t.Fatalf("connect to the test's database: %v", err)
		}
		var got string
		if err := conn.QueryRow(t.Context(), "SELECT current_database()").Scan(&got); err != nil || got != name {
			t.Errorf("current_database() = %q, %v; want %q", got, err, name)
		}
		// Left open on purpose: the cleanup must drop the database anyway.
	})
	conn, err := pgx.Connect(t.Context(), PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context()) //nolint:errcheck // nothing to do about a failed close.
	var n int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n); err != nil || n != 0 {
		t.Errorf("database %s after its test: %d found (error %v), want it dropped", name, n, err)
	}
}
