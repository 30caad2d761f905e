package scripts

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

func runPublicModule(t *testing.T, env []string, args ...string) {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is not on PATH: %v", err)
	}
	cmdArgs := []string{"test", "-count=1"}
	if raceEnabled {
		cmdArgs = append(cmdArgs, "-race")
	}
	cmd := exec.CommandContext(t.Context(), goTool, append(cmdArgs, args...)...)
	cmd.Dir = filepath.Join(root, publicModule)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s in %s: %v\n%s", strings.Join(cmd.Args, " "), cmd.Dir, err, out)
	}
	t.Logf("%s in %s:\n%s", strings.Join(cmd.Args, " "), cmd.Dir, out)
}
