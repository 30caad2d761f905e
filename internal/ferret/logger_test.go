package ferret

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

func TestNewLoggerDropsResponseDumps(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		level    slog.Level
		log      func(*slog.Logger)
		wantLogs bool
	}{
		{"warn response header", slog.LevelWarn, func(l *slog.Logger) { l.Warn("Response header: length: 121") }, false},
		{"warn response body", slog.LevelWarn, func(l *slog.Logger) { l.Warn("Response message:\n{}\n") }, false},
		{"warn proxy response", slog.LevelWarn, func(l *slog.Logger) { l.Warn("Proxy Response message:\n{}\n") }, false},
		{"dump through With", slog.LevelWarn, func(l *slog.Logger) { l.With("name", "conn").Warn("Response header: x") }, false},
		{"error response dump", slog.LevelWarn, func(l *slog.Logger) { l.Error("Response header: length: 121") }, true},
		{"other warning", slog.LevelWarn, func(l *slog.Logger) { l.Warn("Failed to set deadline") }, true},
		{"info below level", slog.LevelWarn, func(l *slog.Logger) { l.Info("Listening") }, false},
		{"debug keeps dumps", slog.LevelDebug, func(l *slog.Logger) { l.Warn("Response header: x") }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			tt.log(NewLogger(&buf, tt.level))
			if got := buf.Len() > 0; got != tt.wantLogs {
				t.Errorf("logged %q, want output: %v", strings.TrimSpace(buf.String()), tt.wantLogs)
			}
		})
	}
}

func TestNewLoggerDemotesDuplicateKeyInserts(t *testing.T) {
	t.Parallel()
	dup := &pgconn.PgError{Severity: "ERROR", Code: "23505", Message: "duplicate key value violates unique constraint"}
	other := &pgconn.PgError{Severity: "ERROR", Code: "53300", Message: "too many connections"}
	tests := []struct {
		name  string
		sql   string
		err   any
		level slog.Level
		want  string // the level logged, "" for nothing
	}{
		{"duplicate insert", `INSERT INTO "outbox"."events_owners_1" (_jsonb) VALUES ($1)`, dup, slog.LevelWarn, ""},
		{"duplicate insert at debug", `INSERT INTO "outbox"."events_owners_1" (_jsonb) VALUES ($1)`, dup, slog.LevelDebug, "DEBUG"},
		{"duplicate insert wrapped", `insert into t values ($1)`, fmt.Errorf("exec: %w", dup), slog.LevelWarn, ""},
		{"duplicate insert as text", `INSERT INTO t VALUES ($1)`, `ERROR: duplicate key value (SQLSTATE 23505)`, slog.LevelWarn, ""},
		{"other insert error", `INSERT INTO t VALUES ($1)`, other, slog.LevelWarn, "ERROR"},
		{"duplicate on update", `UPDATE t SET _jsonb = $1`, dup, slog.LevelWarn, "ERROR"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			NewLogger(&buf, tt.level).With("name", "postgresql").Error("Query", "err", tt.err, "sql", tt.sql)
			got := ""
			if m := regexp.MustCompile(`level=(\w+)`).FindStringSubmatch(buf.String()); m != nil {
				got = m[1]
			}
			if got != tt.want {
				t.Errorf("logged at %q, want %q; output: %q", got, tt.want, buf.String())
			}
			if tt.want == "DEBUG" && !strings.Contains(buf.String(), "sql=") {
				t.Errorf("demoted record lost its attributes: %q", buf.String())
			}
		})
	}
}

// TestDuplicateKeyInsertNotAnError inserts the same _id twice through an
// embedded FerretDB, as two replicas taking one partition term do, and
// checks that its log holds no error: the loser's E11000 is its answer.
func TestDuplicateKeyInsertNotAnError(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	pgURL := testDatabase(t, ctx, "ferret_dupkey_")
	var buf syncBuffer
	uri, err := Start(ctx, "127.0.0.1:0", pgURL, NewLogger(&buf, slog.LevelWarn))
	if err != nil {
		t.Fatal(err)
	}
	client, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = client.Disconnect(context.WithoutCancel(ctx)) }()
	owners := client.Database("outbox").Collection("events_owners")
	if _, err := owners.InsertOne(ctx, bson.M{"_id": "p0/1"}); err != nil {
		t.Fatalf("first insert: %v", err)
	}
	if _, err := owners.InsertOne(ctx, bson.M{"_id": "p0/1"}); !mongo.IsDuplicateKeyError(err) {
		t.Fatalf("second insert: %v, want a duplicate key error", err)
	}
	if s := buf.String(); strings.Contains(s, "level=ERROR") {
		t.Errorf("FerretDB logged an error for an expected duplicate key:\n%s", s)
	}
}

// syncBuffer is a bytes.Buffer that FerretDB's goroutines may write while
// the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// testDatabase returns the URL of a new PostgreSQL database named with
// prefix and a random suffix, dropped (connections and all) after the test.
func testDatabase(t *testing.T, ctx context.Context, prefix string) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := prefix + hex.EncodeToString(b[:])
	pgURL, err := WithDatabase(adminURL, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := EnsurePostgresDatabase(ctx, pgURL); err != nil {
		t.Fatalf("PostgreSQL at %s is needed (pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start): %v", adminURL, err)
	}
	t.Cleanup(func() {
		// DROP DATABASE waits for an immediate checkpoint: beside other
		// packages' writes it took over 30 s.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		admin, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			t.Errorf("drop test database %s: %v", name, err)
			return
		}
		defer admin.Close(ctx)
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("drop test database %s: %v", name, err)
		}
	})
	return pgURL
}
