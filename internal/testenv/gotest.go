package testenv

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// GoTest runs `go test -count=1 args...` in dir as another process, with
// env added to this one's, and fails the test with its output if it
// fails (logging it otherwise): for a suite run again against other
// servers (the container suite's RabbitMQ versions) or in another module
// (the public module in events/, which `go test ./...` does not enter).
// The suite reads its servers from env, as this package's helpers do.
func GoTest(t testing.TB, dir string, env []string, args ...string) {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("testenv: the go command is not on PATH: %v", err)
	}
	cmd := exec.CommandContext(t.Context(), goTool, append([]string{"test", "-count=1"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s in %s (%s): %v\n%s", strings.Join(cmd.Args, " "), dir, strings.Join(env, " "), err, out)
	}
	t.Logf("%s in %s:\n%s", strings.Join(cmd.Args, " "), dir, out)
}
