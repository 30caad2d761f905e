package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// configMapDir lays out a directory as Kubernetes mounts a ConfigMap:
// fleet.yaml -> ..data/fleet.yaml, ..data -> the directory of the
// current version, and returns a function that swaps in a new version.
func configMapDir(t *testing.T, first string) (path string, swap func(version, text string)) {
	t.Helper()
	dir := t.TempDir()
	write := func(version, text string) {
		if err := os.MkdirAll(filepath.Join(dir, version), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, version, "fleet.yaml"), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		// The swap: a new link beside the old one, renamed over it.
		if err := os.Symlink(version, filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	write("..v1", first)
	path = filepath.Join(dir, "fleet.yaml")
	if err := os.Symlink(filepath.Join("..data", "fleet.yaml"), path); err != nil {
		t.Fatal(err)
	}
	return path, write
}

func TestFileWatcherSeesAConfigMapSwap(t *testing.T) {
	t.Parallel()
	path, swap := configMapDir(t, "outboxes: [a]\n")
	fw, err := watchFile(path, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fw.Close() })

	// Neither another file nor the same content is a change.
	if err := os.WriteFile(filepath.Join(filepath.Dir(path), "other.yaml"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	swap("..v2", "outboxes: [a]\n")
	select {
	case <-fw.Changed():
		t.Fatal("a change was told of for another file, or for the same content")
	case <-time.After(3 * watchDebounce):
	}

	swap("..v3", "outboxes: [a, b]\n")
	select {
	case <-fw.Changed():
	case <-time.After(10 * time.Second):
		t.Fatal("no change told of 10s after the ConfigMap's symlink swap")
	}
	// An edit in place is seen too.
	if err := os.WriteFile(filepath.Join(filepath.Dir(path), "..v3", "fleet.yaml"), []byte("outboxes: [c]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case <-fw.Changed():
	case <-time.After(10 * time.Second):
		t.Fatal("no change told of 10s after the file was written")
	}
}
