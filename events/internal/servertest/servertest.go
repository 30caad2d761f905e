// Package servertest gives this module's tests the servers they talk to,
// named by the environment: a MongoDB wire-protocol server
// (OUTBOX_TEST_MONGO_URI), RabbitMQ (OUTBOX_TEST_AMQP_URL) and, for the
// tests of transactions, a replica set (OUTBOX_TEST_REPLICA_SET_URI).
//
// It starts no server itself: this module's go.mod holds only what
// producers and consumers need, and an embedded FerretDB or
// testcontainers-go would bring the relay's whole dependency graph into
// it. The relay's module runs these tests with the servers set
// (scripts/publicmodule_test.go: FerretDB and RabbitMQ in `make test`, a
// MongoDB replica set in the container suite); run alone, a test that
// needs an unset server fails saying how to get one, except the replica
// set's, which skip as the container suite does without Docker.
//
// It is imported only from _test.go files.
package servertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// The variables that name the servers.
const (
	EnvMongoURI      = "OUTBOX_TEST_MONGO_URI"
	EnvReplicaSetURI = "OUTBOX_TEST_REPLICA_SET_URI"
	EnvAMQPURL       = "OUTBOX_TEST_AMQP_URL"
)

// AMQPURLDefault is the RabbitMQ used when OUTBOX_TEST_AMQP_URL is unset:
// the one a developer's machine and CI run.
const AMQPURLDefault = "amqp://guest:guest@127.0.0.1:5672/"

// WaitTimeout bounds every wait of a test on a server or a loop.
const WaitTimeout = 30 * time.Second

const (
	connectTimeout = 10 * time.Second
	cleanupTimeout = 2 * time.Minute
	maxPoolSize    = 20
)

// MongoURI returns OUTBOX_TEST_MONGO_URI, failing the test when it is
// unset.
func MongoURI(t testing.TB) string {
	t.Helper()
	uri := os.Getenv(EnvMongoURI)
	if uri == "" {
		t.Fatalf("%s is not set: point it at a MongoDB or FerretDB, or run these tests from the repository's root with `make test`, "+
			"which starts FerretDB for them (scripts/publicmodule_test.go)", EnvMongoURI)
	}
	return uri
}

// ReplicaSetURI returns OUTBOX_TEST_REPLICA_SET_URI, a MongoDB replica set
// with transactions, and skips the test when it is unset: the relay's
// container suite sets it where Docker exists.
func ReplicaSetURI(t testing.TB) string {
	t.Helper()
	uri := os.Getenv(EnvReplicaSetURI)
	if uri == "" {
		t.Skipf("%s is not set: the relay's container suite starts a MongoDB replica set and sets it (needs Docker)", EnvReplicaSetURI)
	}
	return uri
}

// Connect returns a pinged client of uri, disconnected in t.Cleanup.
func Connect(t testing.TB, uri string) *mongo.Client {
	t.Helper()
	client, err := mongo.Connect(options.Client().ApplyURI(uri).SetMaxPoolSize(maxPoolSize))
	if err != nil {
		t.Fatalf("servertest: connect to MongoDB at %s: %v", redact(uri), err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		_ = client.Disconnect(ctx)
	})
	ctx, cancel := context.WithTimeout(t.Context(), connectTimeout)
	defer cancel()
	if err := client.Ping(ctx, nil); err != nil {
		t.Fatalf("servertest: ping MongoDB at %s: %v", redact(uri), err)
	}
	return client
}

// Database returns a database with a unique name on MongoURI's server,
// dropped in t.Cleanup.
func Database(t testing.TB) *mongo.Database {
	t.Helper()
	db := Connect(t, MongoURI(t)).Database(UniqueName(t, "t_"))
	// Registered after Connect's cleanup, so it runs before the disconnect.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		if err := db.Drop(ctx); err != nil {
			t.Logf("servertest: drop database %s: %v", db.Name(), err)
		}
	})
	return db
}

// IsFerretDB reports whether client's server is FerretDB, which names its
// own version in buildInfo.
func IsFerretDB(t testing.TB, client *mongo.Client) bool {
	t.Helper()
	var info bson.Raw
	if err := client.Database("admin").RunCommand(t.Context(), bson.D{{Key: "buildInfo", Value: 1}}).Decode(&info); err != nil {
		t.Fatalf("servertest: buildInfo: %v", err)
	}
	_, err := info.LookupErr("ferretdbVersion")
	return err == nil
}

// rabbit caches the reachability check of the first AMQPURL call.
var rabbit struct {
	once sync.Once
	err  error
}

// AMQPURL returns OUTBOX_TEST_AMQP_URL or AMQPURLDefault, failing the
// test when it cannot be dialled.
func AMQPURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv(EnvAMQPURL)
	if u == "" {
		u = AMQPURLDefault
	}
	rabbit.once.Do(func() {
		conn, err := dial(u)
		if err != nil {
			rabbit.err = fmt.Errorf("RabbitMQ is not reachable at %s: %w; start it (rabbitmq-server -detached) or point %s at another server",
				redact(u), err, EnvAMQPURL)
			return
		}
		rabbit.err = conn.Close()
	})
	if rabbit.err != nil {
		t.Fatalf("servertest: %v", rabbit.err)
	}
	return u
}

func dial(u string) (*amqp.Connection, error) {
	return amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(connectTimeout)})
}

// Dial opens a connection of the test's own to amqpURL, closed in
// t.Cleanup.
func Dial(t testing.TB, amqpURL string) *amqp.Connection {
	t.Helper()
	conn, err := dial(amqpURL)
	if err != nil {
		t.Fatalf("servertest: dial RabbitMQ at %s: %v", redact(amqpURL), err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// UniqueName is prefix, a short form of the test's name and a random
// suffix, in [a-z0-9_] and at most 38 characters for a short prefix: a
// valid database, collection, exchange or queue name that no other test
// shares.
func UniqueName(t testing.TB, prefix string) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails.
	suffix := hex.EncodeToString(b[:])
	var name strings.Builder
	for _, r := range strings.ToLower(strings.TrimPrefix(t.Name(), "Test")) {
		if ('a' <= r && r <= 'z') || ('0' <= r && r <= '9') {
			name.WriteRune(r)
		}
	}
	n := name.String()
	if room := 38 - len(prefix) - len(suffix) - 1; len(n) > room {
		n = n[:max(room, 0)]
	}
	return prefix + n + "_" + suffix
}

// Service starts and stops as the inbox does.
type Service interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// Start starts svc and stops it in t.Cleanup, failing the test if either
// fails.
func Start(t testing.TB, svc Service) {
	t.Helper()
	if err := svc.Start(t.Context()); err != nil {
		t.Fatalf("Start %T: %v", svc, err)
	}
	t.Cleanup(func() {
		// Not t.Context(): that is canceled before cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), WaitTimeout)
		defer cancel()
		if err := svc.Stop(ctx); err != nil {
			t.Errorf("Stop %T: %v", svc, err)
		}
	})
}

// Eventually asks cond until it reports done, every 10 ms at first and
// then less often, and fails the test with cond's last word on why not
// after timeout. Tests wait for a loop with it instead of sleeping.
func Eventually(t testing.TB, timeout time.Duration, cond func() (done bool, why string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	wait := 10 * time.Millisecond
	for {
		done, why := cond()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not done after %s: %s", timeout, why)
		}
		time.Sleep(wait)
		wait = min(2*wait, 100*time.Millisecond)
	}
}

// LogBuffer collects what a logger writes from several goroutines.
type LogBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// redact hides a URI's password.
func redact(uri string) string {
	u, err := url.Parse(uri)
	if err != nil {
		return "(a URI that does not parse)"
	}
	return u.Redacted()
}
