package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// A run's figures are written in the order of their stages, between the
// header and the stage times; a figure the run did not measure is left
// out, and reading the JSON back gives the same figures.
func TestResultsJSONFollowsTheStages(t *testing.T) {
	t.Parallel()
	var ran []string
	stages := []stage{fakeStage("b", false, &ran), fakeStage("a", false, &ran), fakeStage("unrun", false, &ran)}
	r := Results{StartedAt: time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC), TotalSeconds: 3}
	a, b := figure[int]{"a"}, figure[int]{"b"}
	a.set(&r, 1)
	b.set(&r, 2)
	r.Stages = []StageTime{{Name: "b1", Seconds: 1}}
	r.evaluate(stages)

	data, err := r.marshal(stages)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	dec := json.NewDecoder(strings.NewReader(string(data)))
	if _, err := dec.Token(); err != nil {
		t.Fatal(err)
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, tok.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"startedAt", "totalSeconds", "machine", "config", "b", "a", "stages", "targets"}
	if diff := cmp.Diff(want, keys); diff != "" {
		t.Errorf("bench.json's keys (-want +got):\n%s", diff)
	}

	var back Results
	if err := back.unmarshal(data, stages); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(r.figures, back.figures); diff != "" {
		t.Errorf("figures read back (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(r.Targets, back.Targets); diff != "" {
		t.Errorf("targets read back (-want +got):\n%s", diff)
	}
	if !back.StartedAt.Equal(r.StartedAt) || back.TotalSeconds != 3 || len(back.Stages) != 1 {
		t.Errorf("header read back: %+v", back)
	}
}

// A figure written as null (runs from before figures were left out when
// not measured) or of a stage that no longer exists is not measured.
func TestResultsJSONSkipsNullAndUnknownFigures(t *testing.T) {
	t.Parallel()
	stages := []stage{fakeStage("a", false, nil), fakeStage("b", false, nil)}
	var r Results
	if err := r.unmarshal([]byte(`{"a": null, "b": 3, "gone": {"x": 1}}`), stages); err != nil {
		t.Fatal(err)
	}
	a, b := figure[int]{"a"}, figure[int]{"b"}
	if _, ok := a.get(&r); ok {
		t.Error("a null figure reads as measured")
	}
	if n, ok := b.get(&r); !ok || n != 3 {
		t.Errorf("figure b = %d, %t; want 3", n, ok)
	}
	if err := r.unmarshal([]byte(`{"b": "three"}`), stages); err == nil || !strings.Contains(err.Error(), "b") {
		t.Errorf("a figure of the wrong type: %v, want an error naming it", err)
	}
}

// results/bench.json reads and writes back to the same figures and
// targets: the format did not change with the stages.
func TestResultsJSONRoundTripsTheLatestRun(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../results/bench.json")
	if err != nil {
		t.Fatal(err)
	}
	r, err := loadResults("../../results/bench.json")
	if err != nil {
		t.Fatal(err)
	}
	again, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	var want, got map[string]any
	if err := json.Unmarshal(data, &want); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(again, &got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("results/bench.json written back (-file +written):\n%s", diff)
	}
	if _, ok := drainsFig.get(r); !ok {
		t.Error("results/bench.json has no drains")
	}
}
