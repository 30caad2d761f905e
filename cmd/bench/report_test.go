package main

import (
	"os"
	"strings"
	"testing"
)

// The table of docs/performance.md is the one results/bench.json gives:
// figures are stated once, by the run that measured them.
func TestPerformanceDocTableIsTheRunsTable(t *testing.T) {
	t.Parallel()
	r, err := loadResults("../../results/bench.json")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../docs/performance.md")
	if err != nil {
		t.Fatal(err)
	}
	got, _, _, err := docTableIn(string(doc))
	if err != nil {
		t.Fatalf("docs/performance.md: %v", err)
	}
	if want := docTable(r); got != want {
		t.Errorf("docs/performance.md's table differs from results/bench.json's; run make bench-doc.\ngot:\n%s\nwant:\n%s", got, want)
	}
}

func TestWriteDocTableReplacesOnlyTheTable(t *testing.T) {
	t.Parallel()
	r, err := loadResults("../../results/bench.json")
	if err != nil {
		t.Fatal(err)
	}
	path := t.TempDir() + "/doc.md"
	before := "# Title\n\nText.\n\n" + docTableBegin + "\n| old | table |\n" + docTableEnd + "\n\nAfter.\n"
	if err := os.WriteFile(path, []byte(before), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeDocTable(path, r); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := "# Title\n\nText.\n\n" + docTableBegin + "\n" + docTable(r) + docTableEnd + "\n\nAfter.\n"
	if string(data) != want {
		t.Errorf("after writeDocTable:\n%s\nwant:\n%s", data, want)
	}
	if !strings.Contains(docTable(r), "| Measure | Result | Target | Status |") {
		t.Errorf("the table has no heading row:\n%s", docTable(r))
	}
	if err := writeDocTable(t.TempDir()+"/none.md", r); err == nil {
		t.Error("writeDocTable on a missing document: no error")
	}
}
