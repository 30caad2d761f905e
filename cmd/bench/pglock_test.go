package main

import (
	"strings"
	"testing"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestLockPostgresRefusesASecondRun: while one run holds a database, a
// second run on it stops with an error that names the database and the
// flag; a run on another database, or after the first ends, goes ahead.
func TestLockPostgresRefusesASecondRun(t *testing.T) {
	t.Parallel()
	first, firstName := testenv.PostgresDatabase(t, "bench_lock_a_")
	other, _ := testenv.PostgresDatabase(t, "bench_lock_b_")

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
