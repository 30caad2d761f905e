package testenv

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcmongo "github.com/testcontainers/testcontainers-go/modules/mongodb"
	tcrabbit "github.com/testcontainers/testcontainers-go/modules/rabbitmq"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

const dockerCheckTimeout = 15 * time.Second

// MongoImage is the MongoDB the container suites run.
const MongoImage = "mongo:7"

// EnvRequireDocker, set to "required", makes the container suite fail
// rather than skip without Docker: for the CI job whose only purpose is
// that suite.
const EnvRequireDocker = "OUTBOX_TEST_DOCKER"

// RequireDocker skips the test when no Docker engine answers, as found by
// testcontainers-go (DOCKER_HOST, Docker contexts, ~/.testcontainers.properties,
// the default sockets). It is the only helper in this package that skips:
// the container suite runs where Docker exists. With EnvRequireDocker set
// to "required" it fails instead.
func RequireDocker(t testing.TB) {
	t.Helper()
	err := checkDocker(t.Context())
	switch {
	case err == nil:
	case os.Getenv(EnvRequireDocker) == "required":
		t.Fatalf("Docker engine not available: %v; %s=required asks for the container suite", err, EnvRequireDocker)
	default:
		t.Skipf("Docker engine not available: %v; the container suite runs where Docker exists", err)
	}
}

// checkDocker is dockerHealth, or a stand-in in this package's tests.
var checkDocker = dockerHealth

func dockerHealth(ctx context.Context) (err error) {
	// testcontainers-go panics on some broken Docker configurations.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("testcontainers: %v", r)
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, dockerCheckTimeout)
	defer cancel()

	provider, err := testcontainers.ProviderDocker.GetProvider()
	if err != nil {
		return err
	}
	defer provider.Close() //nolint:errcheck // nothing to do about a failed close.
	return provider.Health(ctx)
}

// RabbitImage is the RabbitMQ the container suite runs the relay with.
const RabbitImage = "rabbitmq:3.13-alpine"

// RabbitImage4 is the RabbitMQ 4 series the container suite runs the
// broker's tests and the inbox's against, beside RabbitImage: 4.0 removed
// classic queue mirroring and deprecated transient non-exclusive queues
// and global QoS, and made AMQP 1.0 native, all of which a publisher and
// a consumer meet.
const RabbitImage4 = "rabbitmq:4.2-alpine"

// RabbitImages are the RabbitMQ versions whose differences the container
// suite tests: the last 3.x and a 4.x.
var RabbitImages = []string{RabbitImage, RabbitImage4}

// containerStartTimeout bounds the start of the container suite's servers,
// image pulls included.
const containerStartTimeout = 5 * time.Minute

// ReplicaSet is the container suite's MongoDB for tests that need a client
// of it: RequireDocker (skip, or fail when required), then MongoImage as a
// single-node replica set, so that transactions exist, and a client of it
// with at most ClientMaxPoolSize connections. The container is removed and
// the client disconnected in t.Cleanup.
func ReplicaSet(t testing.TB) *mongo.Client {
	t.Helper()
	RequireDocker(t)
	ctx, cancel := context.WithTimeout(t.Context(), containerStartTimeout)
	defer cancel()
	return connect(t, replicaSetURI(ctx, t), "")
}

// ReplicaSetURI is ReplicaSet's server without its client, for a test
// that connects with options of its own (a command monitor):
// RequireDocker, then MongoImage as a single-node replica set, removed
// in t.Cleanup.
func ReplicaSetURI(t testing.TB) string {
	t.Helper()
	RequireDocker(t)
	ctx, cancel := context.WithTimeout(t.Context(), containerStartTimeout)
	defer cancel()
	return replicaSetURI(ctx, t)
}

// Containers is the container suite's servers for tests that start the
// worker: RequireDocker (skip, or fail when required), then MongoImage as a
// single-node replica set and RabbitImage, both removed in t.Cleanup. It
// returns their URIs.
func Containers(t testing.TB) (mongoURI, amqpURL string) {
	t.Helper()
	RequireDocker(t)
	ctx, cancel := context.WithTimeout(t.Context(), containerStartTimeout)
	defer cancel()
	return replicaSetURI(ctx, t), rabbitURL(ctx, t, RabbitImage)
}

// RabbitMQ is the container suite's broker for a test that starts its
// MongoDB otherwise (ShardedCluster): RequireDocker, then RabbitImage,
// removed in t.Cleanup. It returns its URL.
func RabbitMQ(t testing.TB) string {
	t.Helper()
	return RabbitMQOf(t, RabbitImage)
}

// RabbitMQOf is RabbitMQ with image, one of RabbitImages, for the tests
// run on each RabbitMQ series: RequireDocker (skip, or fail when
// required), then the container, removed in t.Cleanup. It returns its
// AMQP URL, whose user is not guest.
func RabbitMQOf(t testing.TB, image string) string {
	t.Helper()
	RequireDocker(t)
	ctx, cancel := context.WithTimeout(t.Context(), containerStartTimeout)
	defer cancel()
	return rabbitURL(ctx, t, image)
}

// rabbitURL starts image, removed in t.Cleanup, and returns its AMQP URL.
func rabbitURL(ctx context.Context, t testing.TB, image string) string {
	t.Helper()
	// Not guest: RabbitMQ lets guest in from localhost only.
	rc, err := tcrabbit.Run(ctx, image, tcrabbit.WithAdminUsername("outbox"), tcrabbit.WithAdminPassword("outbox-e2e"))
	testcontainers.CleanupContainer(t, rc)
	if err != nil {
		t.Fatalf("testenv: start %s: %v", image, err)
	}
	url, err := rc.AmqpURL(ctx)
	if err != nil {
		t.Fatalf("testenv: RabbitMQ URL of %s: %v", image, err)
	}
	return url + "/"
}

// ContainersWithAuth is Containers with MongoDB's authentication on: its
// root user is user with password (authSource admin), the only user until
// the test creates others. The URI returned is the root user's.
func ContainersWithAuth(t testing.TB, user, password string) (mongoURI, amqpURL string) {
	t.Helper()
	RequireDocker(t)
	ctx, cancel := context.WithTimeout(t.Context(), containerStartTimeout)
	defer cancel()
	return replicaSetURI(ctx, t, tcmongo.WithUsername(user), tcmongo.WithPassword(password)), rabbitURL(ctx, t, RabbitImage)
}

// replicaSetURI starts MongoImage as a single-node replica set, with more
// options if given, removed in t.Cleanup, and returns its URI.
func replicaSetURI(ctx context.Context, t testing.TB, more ...testcontainers.ContainerCustomizer) string {
	t.Helper()
	mc, err := tcmongo.Run(ctx, MongoImage, append([]testcontainers.ContainerCustomizer{tcmongo.WithReplicaSet("rs0")}, more...)...)
	testcontainers.CleanupContainer(t, mc)
	if err != nil {
		t.Fatalf("testenv: start %s: %v", MongoImage, err)
	}
	uri, err := mc.ConnectionString(ctx)
	if err != nil {
		t.Fatalf("testenv: MongoDB connection string: %v", err)
	}
	direct, err := directURI(uri)
	if err != nil {
		t.Fatalf("testenv: MongoDB connection string %q: %v", uri, err)
	}
	return direct
}

// directURI is uri with directConnection=true. The member of a replica set
// in a container is registered under the container's own address, which
// the host may not reach: the driver must keep to the mapped port it was
// given. hello still reports the replica set, so transactions are used.
func directURI(uri string) (string, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return "", err
	}
	q := u.Query()
	q.Set("directConnection", "true")
	u.RawQuery = q.Encode()
	return u.String(), nil
}
