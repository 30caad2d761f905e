package ferret

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
)

// adminURL is the PostgreSQL server of the test environment
// (see internal/testenv). This package cannot use internal/testenv,
// which imports it.
const adminURL = "postgres://postgres@127.0.0.1:5432/postgres"

func TestEnsurePostgresDatabaseConcurrent(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "ferret_ensure_" + hex.EncodeToString(b[:])
	pgURL, err := WithDatabase(adminURL, name)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		t.Fatalf("PostgreSQL at %s is needed (pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start): %v", adminURL, err)
	}
	t.Cleanup(func() {
		// DROP DATABASE waits for an immediate checkpoint: beside other
		// packages' writes it took over 30 s.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()); err != nil {
			t.Errorf("drop test database %s: %v", name, err)
		}
		_ = admin.Close(ctx)
	})

	// Several processes (test binaries) may create the same database at once.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { errs[i] = EnsurePostgresDatabase(ctx, pgURL) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("concurrent EnsurePostgresDatabase #%d: %v", i, err)
		}
	}
	if err := EnsurePostgresDatabase(ctx, pgURL); err != nil {
		t.Errorf("EnsurePostgresDatabase on an existing database: %v", err)
	}

	var n int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("pg_database has %d rows for %s, want 1", n, name)
	}
}

func TestEnsurePostgresDatabaseUnreachable(t *testing.T) {
	t.Parallel()
	err := EnsurePostgresDatabase(t.Context(), "postgres://postgres:secret@127.0.0.1:1/x?connect_timeout=2")
	if err == nil {
		t.Fatal("no error for a closed port")
	}
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("error leaks the password: %v", err)
	}
}

func TestWithDatabase(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, name, want string
		wantErr        bool
	}{
		{in: "postgres://postgres@127.0.0.1:5432/postgres", name: "ferret_x", want: "postgres://postgres@127.0.0.1:5432/ferret_x"},
		{in: "postgresql://u:p@h/db?sslmode=disable", name: "n", want: "postgresql://u:p@h/n?sslmode=disable"},
		{in: "postgres://h", name: "n", want: "postgres://h/n"},
		{in: "host=h dbname=x", name: "n", wantErr: true},
	}
	for _, tt := range tests {
		got, err := WithDatabase(tt.in, tt.name)
		if (err != nil) != tt.wantErr {
			t.Errorf("WithDatabase(%q, %q) error = %v, want error: %v", tt.in, tt.name, err, tt.wantErr)
			continue
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("WithDatabase(%q, %q) (-want +got):\n%s", tt.in, tt.name, diff)
		}
	}
}
