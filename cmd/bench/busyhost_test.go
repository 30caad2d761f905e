package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestLoggedTimeouts reads the worker's timeout warnings as the text
// handler writes them, and counts a limit left twice as a repeat.
func TestLoggedTimeouts(t *testing.T) {
	t.Parallel()
	log := `time=2026-11-28T01:00:00Z level=INFO msg=starting
time=2026-11-28T01:00:01Z level=WARN msg="database timed out; claiming smaller batches" operation=claim batch_limit=250 error="claim 500 events: i/o timeout"
time=2026-11-28T01:00:02Z level=WARN msg="database timed out; claiming smaller batches" operation=claim batch_limit=125 error="claim 250 events: i/o timeout"
time=2026-11-28T01:00:09Z level=WARN msg="database timed out; claiming smaller batches" operation="outcome write" batch_limit=125 error=timeout
time=2026-11-28T01:00:10Z level=WARN msg="sampler: held aggregates not read; the last read stands"
`
	path := filepath.Join(t.TempDir(), "worker.log")
	if err := os.WriteFile(path, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := loggedTimeouts(path)
	if err != nil {
		t.Fatal(err)
	}
	want := Timeouts{Claims: 3, LowestLimit: 125, Repeats: 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("loggedTimeouts (-want +got):\n%s", diff)
	}
}
