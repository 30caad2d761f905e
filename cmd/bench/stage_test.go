package main

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// fakeStage is a stage whose steps record their names in ran when they
// run. Its figure, under its key, is a count n: its row shows n x's, and
// its target wants n of 2 at least.
func fakeStage(key string, optIn bool, ran *[]string, steps ...string) stage {
	fig := figure[int]{key}
	return stage{
		key: key, optIn: optIn, figures: []anyFigure{fig},
		steps: func(*bench) []step {
			var out []step
			for _, name := range steps {
				out = append(out, step{name, func(context.Context) error {
					*ran = append(*ran, name)
					return nil
				}})
			}
			return out
		},
		rows: func(r *Results, add addRow) {
			if n, ok := fig.get(r); ok {
				add("fake "+key, strings.Repeat("x", n), "fake target "+key)
			}
		},
		targets: func(r *Results, add addTarget) {
			if n, ok := fig.get(r); ok {
				add("fake target "+key, ">= 2", strings.Repeat("x", n), n >= 2)
			}
		},
	}
}

func TestRunStagesRunsTheSelectedStagesInOrder(t *testing.T) {
	t.Parallel()
	tests := []struct {
		only string
		want []string
	}{
		{"", []string{"a1", "a2", "b1"}},
		{"b", []string{"b1"}},
		{"slow", []string{"s1"}},
		{"slow, a", []string{"a1", "a2", "s1"}}, // stage order, not -only's
	}
	for _, tt := range tests {
		t.Run(tt.only, func(t *testing.T) {
			t.Parallel()
			var ran []string
			stages := []stage{
				fakeStage("a", false, &ran, "a1", "a2"),
				{rows: func(*Results, addRow) {}}, // a side measurement: never runs
				fakeStage("b", false, &ran, "b1"),
				fakeStage("slow", true, &ran, "s1"),
			}
			only, err := parseOnly(tt.only, stages)
			if err != nil {
				t.Fatal(err)
			}
			var r Results
			var out bytes.Buffer
			if err := runStages(t.Context(), nil, stages, only, &r, &out); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, ran); diff != "" {
				t.Errorf("steps run (-want +got):\n%s", diff)
			}
			var timed []string
			for _, s := range r.Stages {
				timed = append(timed, s.Name)
			}
			if diff := cmp.Diff(tt.want, timed); diff != "" {
				t.Errorf("stage times recorded (-want +got):\n%s", diff)
			}
			for _, name := range tt.want {
				if !strings.Contains(out.String(), "== "+name+"\n") {
					t.Errorf("output does not announce %q:\n%s", name, out.String())
				}
			}
		})
	}
}

func TestRunStagesStopsAtTheFirstFailingStep(t *testing.T) {
	t.Parallel()
	var ran []string
	broken := errors.New("broken")
	stages := []stage{
		{key: "bad", steps: func(*bench) []step {
			return []step{{"bad step", func(context.Context) error { return broken }}}
		}},
		fakeStage("after", false, &ran, "after1"),
	}
	var r Results
	err := runStages(t.Context(), nil, stages, nil, &r, &bytes.Buffer{})
	if !errors.Is(err, broken) || !strings.Contains(err.Error(), "bad step") {
		t.Errorf("runStages: %v, want the step's error under its name", err)
	}
	if len(ran) != 0 {
		t.Errorf("ran %v after a failed step", ran)
	}
	if len(r.Stages) != 1 || r.Stages[0].Name != "bad step" {
		t.Errorf("stage times %+v: want the failed step's", r.Stages)
	}
}

func TestParseOnlyRejectsUnknownStages(t *testing.T) {
	t.Parallel()
	stages := []stage{fakeStage("a", false, nil), {rows: func(*Results, addRow) {}}}
	for _, only := range []string{"b", "a,b", "a,", " "} {
		if _, err := parseOnly(only, stages); err == nil || !strings.Contains(err.Error(), "unknown stage") {
			t.Errorf("parseOnly(%q): %v, want an unknown stage", only, err)
		}
	}
	if _, err := parseFlags([]string{"-only", "raw-broker,nonsense"}, func(string) string { return "" }); err == nil ||
		!strings.Contains(err.Error(), "backlog-50k") {
		t.Errorf("-only with an unknown stage: %v, want an error listing the stages", err)
	}
}

// The harness's own stages: what -only and the default run select.
func TestStagesSelection(t *testing.T) {
	t.Parallel()
	all := stages()
	keys := stageKeys(all)
	want := []string{"raw-broker", "publish", "raw-db", "drain", "drain-unordered", "hot-aggregate", "skewed-producers", "latency", "claim",
		"retention", "claim-backoff", "held-aggregates", "large-docs", "inbox", "console", "tracing",
		"db-latency-100ms", "db-latency-600ms", "backlog-20k", "backlog-20k-busy", "backlog-20k-skipped", "backlog-50k", "paused-head", "held-head", "fleet-idle", "fleet-fair"}
	if diff := cmp.Diff(want, keys); diff != "" {
		t.Errorf("stage keys (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"backlog-20k", "backlog-20k-busy", "backlog-20k-skipped", "backlog-50k", "paused-head", "held-head", "fleet-idle", "fleet-fair"}, optInKeys(all)); diff != "" {
		t.Errorf("opt-in stages (-want +got):\n%s", diff)
	}
	only, err := parseOnly("backlog-50k", all)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		if got := selected(s, only); got != (s.key == "backlog-50k") {
			t.Errorf("-only backlog-50k: stage %q selected %t", s.key, got)
		}
		if s.key != "" && s.steps == nil {
			t.Errorf("stage %q has a key but no steps", s.key)
		}
		if s.key == "" && s.steps != nil {
			t.Errorf("a stage without a key has steps: -only could not select it")
		}
	}
	var ran []string
	for _, s := range all {
		if selected(s, nil) {
			ran = append(ran, s.key)
		}
	}
	if slices.Contains(ran, "backlog-20k") || slices.Contains(ran, "backlog-20k-busy") || slices.Contains(ran, "backlog-50k") || slices.Contains(ran, "paused-head") ||
		slices.Contains(ran, "held-head") || !slices.Contains(ran, "db-latency-600ms") {
		t.Errorf("the default run selects %v: want every stage but the large backlogs and the starvation stages", ran)
	}
}

// Every figure of bench.json has one owner, but the slow-database stages
// share theirs, and so do the starvation stages; none is named like a
// field of Results.
func TestStagesOwnDistinctFigures(t *testing.T) {
	t.Parallel()
	owners := map[string][]string{}
	for _, s := range stages() {
		for _, f := range s.figures {
			owners[f.jsonKey()] = append(owners[f.jsonKey()], s.key)
		}
	}
	for k, o := range owners {
		if len(o) > 1 && k != slowFig.key && k != starveFig.key {
			t.Errorf("figure %q owned by stages %q", k, o)
		}
	}
	if o := owners[slowFig.key]; len(o) != 6 {
		t.Errorf("figure %q owned by %q: want the six slow-database stages", slowFig.key, o)
	}
	for _, k := range []string{"startedAt", "totalSeconds", "machine", "config", "stages", "targets"} {
		if _, ok := owners[k]; ok {
			t.Errorf("figure %q is a field of Results", k)
		}
	}
}

// The settings of the large backlogs: the worker at its defaults on the
// direct path, against the raw loop.
func TestSlowStageSettings(t *testing.T) {
	t.Parallel()
	cfg, err := parseFlags(nil, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	for key, backlog := range map[string]int{"backlog-20k": 20000, "backlog-50k": 50000} {
		s := cfg.slowStage(key)
		if s.backlog != backlog || s.latency != 0 || len(s.env) != 0 {
			t.Errorf("%s: backlog %d, latency %s, env %v: want %d events at the worker's defaults, direct", key, s.backlog, s.latency, s.env, backlog)
		}
	}
	if s := cfg.slowStage("db-latency-600ms"); s.latency != 600*time.Millisecond || s.backlog != cfg.LatencyBacklog {
		t.Errorf("db-latency-600ms: %+v", s)
	}
}

func TestInsertBudget(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                string
		limit, left, claims time.Duration
		want                time.Duration
	}{
		{"the limit, with time to spare", 100 * time.Second, 9 * time.Minute, 5 * time.Second, 100 * time.Second},
		{"what is left after the claims and the report", 100 * time.Second, 60 * time.Second, 10 * time.Second, 25 * time.Second},
		{"never under 5 s", 100 * time.Second, 20 * time.Second, 10 * time.Second, 5 * time.Second},
		{"past the budget", 100 * time.Second, -time.Minute, time.Second, 5 * time.Second},
	}
	for _, tt := range tests {
		if got := insertBudget(tt.limit, tt.left, tt.claims); got != tt.want {
			t.Errorf("%s: insertBudget(%s, %s, %s) = %s, want %s", tt.name, tt.limit, tt.left, tt.claims, got, tt.want)
		}
	}
}

func TestCommandCounterPerMessage(t *testing.T) {
	t.Parallel()
	c := newCommandCounter()
	c.all.Store(300)
	c.byName["insert"].Store(100)
	c.byName["find"].Store(200)
	all, byName := c.per(100)
	if all != 3 || byName != "find 2.00 insert 1.00" {
		t.Errorf("per(100) = %v, %q; want 3, \"find 2.00 insert 1.00\"", all, byName)
	}
	c.reset()
	if all, byName := c.per(100); all != 0 || byName != "" {
		t.Errorf("after reset: %v, %q", all, byName)
	}
}
