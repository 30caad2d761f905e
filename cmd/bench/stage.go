package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// A stage is one measurement of the run, and everything about it: its
// -only name, the timed steps that measure it, the figures of bench.json
// it owns, its rows of the table and its targets. stages() lists them in
// the order they run and report; adding a stage is adding one value there.
//
// A stage without a key is a side measurement read from other stages'
// figures (commands, CPU and memory per event of the drains): it has no
// steps, and its rows and targets appear whenever those figures exist.
type stage struct {
	key string
	// optIn stages run only when -only names them.
	optIn bool
	// figures are the entries of bench.json the stage writes.
	figures []anyFigure
	// steps are its timed parts, in order, under b's settings; most
	// stages have one.
	steps func(b *bench) []step
	// rows adds its rows of the table from r, and targets its targets;
	// both find nothing to add in a run that did not measure it.
	rows    func(r *Results, add addRow)
	targets func(r *Results, add addTarget)
}

// A step is one timed part of a stage, printed and recorded in the stage
// durations under its name.
type step struct {
	name string
	run  func(context.Context) error
}

// addRow adds one row of the table; target names the target whose want
// and status the row shows, if any.
type addRow func(measure, result, target string)

// addTarget records one target and whether the run met it.
type addTarget func(name, want, got string, met bool)

// one is the steps of a stage with a single step.
func one(name string, run func(*bench, context.Context) error) func(*bench) []step {
	return func(b *bench) []step {
		return []step{{name, func(ctx context.Context) error { return run(b, ctx) }}}
	}
}

// rateRow is the rows of a stage whose one row is fig's rate in unit per
// second, under the measure that measure names; none before fig is set.
func rateRow(fig figure[Rate], unit string, measure func(*Results) string) func(*Results, addRow) {
	return func(r *Results, add addRow) {
		if rate := fig.value(r); rate.Count > 0 {
			add(measure(r), rate.describe(unit), "")
		}
	}
}

// stageKeys are the -only names of stages, in the order they run.
func stageKeys(stages []stage) []string {
	var keys []string
	for _, s := range stages {
		if s.key != "" {
			keys = append(keys, s.key)
		}
	}
	return keys
}

// optInKeys are the -only names of the opt-in stages.
func optInKeys(stages []stage) []string {
	var keys []string
	for _, s := range stages {
		if s.optIn {
			keys = append(keys, s.key)
		}
	}
	return keys
}

// parseOnly reads -only: a comma-separated list of stage names, each of
// which must be one of stages'. Empty selects the default run (nil).
func parseOnly(only string, stages []stage) (map[string]bool, error) {
	if only == "" {
		return nil, nil
	}
	keys := stageKeys(stages)
	sel := map[string]bool{}
	for _, s := range strings.Split(only, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(keys, s) {
			return nil, fmt.Errorf("-only %q: unknown stage %q; want some of %s", only, s, strings.Join(keys, ", "))
		}
		sel[s] = true
	}
	return sel, nil
}

// selected reports whether s runs under the -only selection only (nil:
// every stage but the opt-in ones).
func selected(s stage, only map[string]bool) bool {
	switch {
	case s.key == "" || s.steps == nil:
		return false
	case only == nil:
		return !s.optIn
	default:
		return only[s.key]
	}
}

// runStages runs the selected stages' steps in order, printing each step
// to out and recording its time in r.Stages. It stops at the first step
// that fails.
func runStages(ctx context.Context, b *bench, stages []stage, only map[string]bool, r *Results, out io.Writer) error {
	for _, s := range stages {
		if !selected(s, only) {
			continue
		}
		for _, st := range s.steps(b) {
			if err := runStep(ctx, st, r, out); err != nil {
				return err
			}
		}
	}
	return nil
}

// runStep runs one step and prints and records how long it took.
func runStep(ctx context.Context, st step, r *Results, out io.Writer) error {
	fmt.Fprintf(out, "== %s\n", st.name)
	t0 := time.Now()
	err := st.run(ctx)
	d := time.Since(t0)
	r.Stages = append(r.Stages, StageTime{Name: st.name, Seconds: round(d.Seconds(), 1)})
	if err != nil {
		return fmt.Errorf("%s: %w", st.name, err)
	}
	fmt.Fprintf(out, "   %s took %.1fs\n", st.name, d.Seconds())
	return nil
}

// evaluate sets r.Targets from the figures, stage by stage.
func (r *Results) evaluate(stages []stage) {
	r.Targets = nil
	add := func(name, want, got string, met bool) {
		r.Targets = append(r.Targets, Target{Name: name, Want: want, Got: got, Met: met})
	}
	for _, s := range stages {
		if s.targets != nil {
			s.targets(r, add)
		}
	}
}

// target returns the target called name, if it was evaluated.
func (r *Results) target(name string) (Target, bool) {
	for _, t := range r.Targets {
		if t.Name == name {
			return t, true
		}
	}
	return Target{}, false
}
