package scripts

import (
	"path/filepath"
	"testing"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// publicModule is the directory of the module services import (events,
// events/inbox). `go test ./...` from the root does not enter a nested
// module, so these tests run its suite: its go.mod may not name FerretDB
// or testcontainers-go, and so its tests cannot start their servers; they
// read them from the environment, which these tests set.
const publicModule = "events"

// TestPublicModule runs the public module's tests against the servers of
// this suite: the embedded FerretDB and RabbitMQ. Under the race detector
// (make test's race pass) it runs them under it too.
func TestPublicModule(t *testing.T) {
	t.Parallel()
	runPublicModule(t, []string{
		"OUTBOX_TEST_MONGO_URI=" + testenv.MongoURI(t),
		"OUTBOX_TEST_AMQP_URL=" + testenv.AMQPURL(t),
	}, "./...")
}

// TestContainerPublicModule runs the public module's tests of
// transactions against the container suite's MongoDB replica set; it
// skips, or fails under OUTBOX_TEST_DOCKER=required, without Docker.
func TestContainerPublicModule(t *testing.T) {
	t.Parallel()
	runPublicModule(t, []string{
		"OUTBOX_TEST_REPLICA_SET_URI=" + testenv.ReplicaSetURI(t),
	}, "-run", "Container", "./...")
}

// TestContainerPublicModuleRabbitMQ4 runs the public module's tests
// against RabbitMQ 4 (testenv.RabbitImage4) in a container, with this
// suite's FerretDB: the inbox's queues, dead-lettering and quorum
// queues' delivery counts on the 4.x series; TestPublicModule covers
// the local 3.x.
func TestContainerPublicModuleRabbitMQ4(t *testing.T) {
	t.Parallel()
	// Rabbit first: without Docker it skips before FerretDB starts.
	amqpURL := testenv.RabbitMQOf(t, testenv.RabbitImage4)
	runPublicModule(t, []string{
		"OUTBOX_TEST_MONGO_URI=" + testenv.MongoURI(t),
		testenv.EnvAMQPURL + "=" + amqpURL,
	}, "./...")
}

func runPublicModule(t *testing.T, env []string, args ...string) {
	t.Helper()
	if raceEnabled {
		args = append([]string{"-race"}, args...)
	}
	testenv.GoTest(t, filepath.Join(root, publicModule), env, args...)
}
