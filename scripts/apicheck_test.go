package scripts

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// make api-check has teeth: in a repository of its own holding the public
// module as committed, renaming an exported function fails the check,
// naming the function, until a **Breaking** bullet of the Unreleased
// section names it. The "release" is that first commit, given by hash.
func TestAPICheckRefusesAnUnnamedBreak(t *testing.T) {
	t.Parallel()
	r := newGitRepo(t)
	for _, script := range []string{"scripts/api-check.sh", "scripts/servers.sh"} {
		if err := os.WriteFile(filepath.Join(r.dir, script), readFile(t, script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	copyModule(t, filepath.Join(root, publicModule), filepath.Join(r.dir, publicModule))
	release, _ := r.commit("# Changelog\n\n## Unreleased\n\n- Nothing yet.\n")

	// The rename, everywhere in the package, so that it still builds.
	dir := filepath.Join(r.dir, publicModule)
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte(strings.ReplaceAll(string(b), "PartitionOf(", "PartitionOfKey(")), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	check := func() (string, bool) {
		t.Helper()
		out, err := r.run(exec.CommandContext(t.Context(), "bash", "scripts/api-check.sh", release))
		if exitErr := (*exec.ExitError)(nil); err != nil && !errors.As(err, &exitErr) {
			t.Fatal(err)
		}
		return out, err == nil
	}
	if out, ok := check(); ok || !strings.Contains(out, "INCOMPATIBLE: events.PartitionOf: removed") {
		t.Fatalf("api-check after renaming events.PartitionOf: passed=%v, want a failure naming it:\n%s", ok, out)
	}

	writeChangelog(t, r.dir, "# Changelog\n\n## Unreleased\n\n- **Breaking**: `events.PartitionOf` is now\n  `events.PartitionOfKey`.\n")
	if out, ok := check(); !ok || !strings.Contains(out, "events.PartitionOf: removed: acknowledged") {
		t.Fatalf("api-check with the rename named under **Breaking**: passed=%v, want a pass that says so:\n%s", ok, out)
	}
}

func writeChangelog(t *testing.T, dir, text string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "CHANGELOG.md"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// copyModule copies the module at from to to, without its tests: the
// check reads only the packages' export data.
func copyModule(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(from, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(to, rel), 0o755)
		}
		if strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}
