package testenv

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/internal/ferret"
	"github.com/outboxrelay/outbox/internal/redact"
)

// Environment variables read by this package.
const (
	EnvMongoURI    = "OUTBOX_TEST_MONGO_URI"
	EnvPostgresURL = "OUTBOX_TEST_POSTGRES_URL"
)

// PostgresURLDefault is the PostgreSQL server (and maintenance database) used
// for embedded FerretDB when OUTBOX_TEST_POSTGRES_URL is unset.
const PostgresURLDefault = "postgres://postgres@127.0.0.1:5432/postgres"

// ClientMaxPoolSize bounds each test client's connection pool. FerretDB's own
// PostgreSQL pool holds 50 connections and can hang for good when hundreds of
// commands arrive at once, so test clients stay modest.
const ClientMaxPoolSize = 20

const (
	ferretStartTimeout = 30 * time.Second
	pingTimeout        = 30 * time.Second
	// cleanupTimeout bounds a test database's drop: DROP DATABASE waits
	// for an immediate checkpoint, which beside other packages' writes
	// took over 30 s (CI: internal/ferret).
	cleanupTimeout = 2 * time.Minute
)

// embeddedURI starts, on its first call in this test binary, the FerretDB
// that MongoURI returns. It runs until the process exits.
var embeddedURI = sync.OnceValues(func() (string, error) {
	return startFerret(PostgresURL())
})

// PostgresURL is the PostgreSQL server the tests may use:
// OUTBOX_TEST_POSTGRES_URL, else PostgresURLDefault.
func PostgresURL() string {
	return cmp.Or(os.Getenv(EnvPostgresURL), PostgresURLDefault)
}

// MongoURI returns the URI of a MongoDB wire-protocol server for tests.
//
// If OUTBOX_TEST_MONGO_URI is set, it is returned as-is (real MongoDB).
// Otherwise the first call starts, once per test binary, an embedded FerretDB
// listening on 127.0.0.1 and backed by a PostgreSQL database named after the
// test binary and its package directory, created if missing. If PostgreSQL
// is unreachable, MongoURI fails the test saying how to start it.
func MongoURI(t testing.TB) string {
	t.Helper()
	if uri := os.Getenv(EnvMongoURI); uri != "" {
		return uri
	}
	uri, err := embeddedURI()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return uri
}

// IsFerretDB reports whether tests run against embedded FerretDB (no
// OUTBOX_TEST_MONGO_URI).
func IsFerretDB() bool {
	return os.Getenv(EnvMongoURI) == ""
}

// Client returns a connected client (driver v2) for this test, with a pool of
// at most ClientMaxPoolSize connections, disconnected in t.Cleanup.
func Client(t testing.TB) *mongo.Client {
	t.Helper()
	return connect(t, MongoURI(t), mongoHint())
}

// connect returns a client of uri with a pool of at most ClientMaxPoolSize
// connections, pinged, and disconnected in t.Cleanup. hint follows a
// failed ping.
func connect(t testing.TB, uri, hint string) *mongo.Client {
	t.Helper()
	client, err := mongo.Connect(options.Client().ApplyURI(uri).SetMaxPoolSize(ClientMaxPoolSize))
	if err != nil {
		t.Fatalf("testenv: connect to MongoDB at %s: %v", redact.URL(uri), err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		if err := client.Disconnect(ctx); err != nil {
			t.Logf("testenv: disconnect from MongoDB: %v", err)
		}
	})

	ctx, cancel := context.WithTimeout(t.Context(), pingTimeout)
	defer cancel()
	if err := client.Ping(ctx, nil); err != nil {
		t.Fatalf("testenv: ping MongoDB at %s: %v%s", redact.URL(uri), err, hint)
	}
	return client
}

// ProxiedClient returns a client that reaches MongoDB through a Proxy the
// test can cut, disconnected in t.Cleanup. Its timeouts are short, so that a
// cut surfaces as an error within a second or two rather than after the
// driver's default 30 s of server selection.
func ProxiedClient(t testing.TB) (*mongo.Client, *Proxy) {
	t.Helper()
	uri, proxy := Proxied(t, MongoURI(t))
	client, err := mongo.Connect(options.Client().ApplyURI(uri).
		SetMaxPoolSize(10).
		SetServerSelectionTimeout(time.Second).
		SetConnectTimeout(time.Second).
		SetHeartbeatInterval(500 * time.Millisecond))
	if err != nil {
		t.Fatalf("testenv: connect to MongoDB through a proxy: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		_ = client.Disconnect(ctx)
	})
	return client, proxy
}

// Database returns a database with a unique name for this test (see
// UniqueName) on a new Client, dropped in t.Cleanup.
func Database(t testing.TB) *mongo.Database {
	t.Helper()
	db := Client(t).Database(UniqueName(t, "t_"))
	// Registered after Client's cleanup, so it runs before the disconnect.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		if err := db.Drop(ctx); err != nil {
			t.Logf("testenv: drop database %s: %v", db.Name(), err)
		}
	})
	return db
}

// startFerret creates this binary's PostgreSQL database on the server of
// adminURL and starts FerretDB on it. FerretDB lives as long as the process:
// it is shared by every test.
func startFerret(adminURL string) (string, error) {
	cwd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("embedded FerretDB: %w", err)
	}
	pgURL, err := ferret.WithDatabase(adminURL, ferretDatabaseName(os.Args[0], cwd))
	if err != nil {
		return "", fmt.Errorf("embedded FerretDB: %s: %w", EnvPostgresURL, err)
	}

	// The context outlives every test: FerretDB serves the whole binary.
	ctx, cancel := context.WithTimeout(context.Background(), ferretStartTimeout)
	defer cancel()
	if err := ferret.EnsurePostgresDatabase(ctx, pgURL); err != nil {
		return "", fmt.Errorf("embedded FerretDB needs PostgreSQL, which is not available: %w\n%s", err, postgresHint)
	}

	logger := ferret.NewLogger(os.Stderr, slog.LevelWarn)
	uri, err := ferret.Start(context.Background(), "127.0.0.1:0", pgURL, logger)
	if err != nil {
		return "", fmt.Errorf("embedded FerretDB: %w", err)
	}
	return uri, nil
}

const postgresHint = `Start PostgreSQL with:
    pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start
(install it with: apt-get install -y postgresql), allow trust auth for user postgres
on 127.0.0.1, or point ` + EnvPostgresURL + ` at another server (default ` + PostgresURLDefault + `).
To test against a real MongoDB instead, set ` + EnvMongoURI + `.`

func mongoHint() string {
	if IsFerretDB() {
		return "\nembedded FerretDB did not answer; check PostgreSQL (" + EnvPostgresURL + ")"
	}
	return "\ncheck that the MongoDB server in " + EnvMongoURI + " is running"
}

// ferretDatabaseName names the PostgreSQL database of one test binary: the
// binary's base name (the package name) plus a hash of its working directory
// (the package directory, set by go test), so that packages with the same name
// get different databases and reruns reuse theirs.
func ferretDatabaseName(binary, cwd string) string {
	base := strings.TrimSuffix(filepath.Base(binary), ".exe")
	base = strings.TrimSuffix(base, ".test")
	sum := sha256.Sum256([]byte(cwd))
	name := sanitize(base)
	if len(name) > 40 {
		name = name[:40]
	}
	return "ferret_" + name + "_" + hex.EncodeToString(sum[:4])
}
