package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox/internal/ferret"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestLockPostgresRefusesASecondRun: while one run holds a database, a
// second run on it stops with an error that names the database and the
// flag; a run on another database, or after the first ends, goes ahead.
func TestLockPostgresRefusesASecondRun(t *testing.T) {
	t.Parallel()
	admin := testenv.PostgresURL()
	urlOf := func(prefix string) (string, string) {
		t.Helper()
		name := testenv.UniqueName(t, prefix)
		u, err := ferret.WithDatabase(admin, name)
		if err != nil {
			t.Fatal(err)
		}
		if err := ferret.EnsurePostgresDatabase(t.Context(), u); err != nil {
			t.Fatalf("%v (PostgreSQL must run for this test)", err)
		}
		t.Cleanup(func() { dropPostgresDatabase(t, admin, name) })
		return u, name
	}
	first, firstName := urlOf("bench_lock_a_")
	other, _ := urlOf("bench_lock_b_")

	release, err := lockPostgres(t.Context(), first)
	if err != nil {
		t.Fatalf("first run: %v", err)
	}
	_, err = lockPostgres(t.Context(), first)
	if err == nil || !strings.Contains(err.Error(), `"`+firstName+`"`) || !strings.Contains(err.Error(), "-postgres-url") {
		t.Errorf("second run on the same database: error %v, want one naming the database and -postgres-url", err)
	}
	releaseOther, err := lockPostgres(t.Context(), other)
	if err != nil {
		t.Errorf("a run on another database: %v", err)
	} else {
		releaseOther()
	}
	release()
	again, err := lockPostgres(t.Context(), first)
	if err != nil {
		t.Fatalf("a run after the first ended: %v", err)
	}
	again()
}

// dropPostgresDatabase drops the test's database name, once the runs'
// connections to it are closed.
func dropPostgresDatabase(t *testing.T, adminURL, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		t.Logf("drop PostgreSQL database %s: %v", name, err)
		return
	}
	defer conn.Close(ctx) //nolint:errcheck // nothing to do about a failed close.
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Logf("drop PostgreSQL database %s: %v", name, err)
	}
}
