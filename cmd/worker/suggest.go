package main

import (
	"fmt"
	"slices"
	"strings"
)

// closest returns the candidate nearest to name by edit distance, if it is
// near enough to be what was meant: at most a third of name's length away,
// and at least 2 (one typo, or two letters swapped). Ties go to the
// candidate listed first.
func closest(name string, candidates []string) (string, bool) {
	best, bestDist := "", -1
	for _, c := range candidates {
		if d := editDistance(name, c); bestDist < 0 || d < bestDist {
			best, bestDist = c, d
		}
	}
	if bestDist < 0 || bestDist > max(2, len(name)/3) {
		return "", false
	}
	return best, true
}

// editDistance is the Levenshtein distance between a and b: the fewest
// single-byte insertions, deletions and substitutions that turn a into b.
// Names here are ASCII.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// didYouMean is "; did you mean X?" for the candidate closest to name,
// written as format writes it, or "" when none is close.
func didYouMean(name string, candidates []string, format string) string {
	if c, ok := closest(name, candidates); ok {
		return "; did you mean " + fmt.Sprintf(format, c) + "?"
	}
	return ""
}

// reservedEnvPrefixes are the OUTBOX_ variables that belong to the tests
// and the benchmark (internal/testenv, cmd/worker's end-to-end tests,
// cmd/bench), not to the worker: it does not warn about them.
var reservedEnvPrefixes = []string{"OUTBOX_TEST_", "OUTBOX_E2E_", "OUTBOX_BENCH_"}

// replacedVariables are settings of earlier versions, by the settings that
// replaced them: their suggestion, however far the names are apart.
var replacedVariables = map[string]string{
	// It served the profiler on the HTTP port, to every client.
	"OUTBOX_PPROF": "OUTBOX_PPROF_ADDR",
}

// unknownVariable is an OUTBOX_ environment variable the worker does not
// read, and the setting it may have meant ("" when none is close).
type unknownVariable struct {
	Name, Suggestion string
}

// unknownVariables returns the variables of environ (KEY=value entries)
// that start with OUTBOX_, are no setting of the worker and do not start
// with a reserved prefix, sorted by name.
func unknownVariables(environ []string) []unknownVariable {
	var known, short []string
	for _, s := range settings() {
		known = append(known, s.env)
		short = append(short, strings.TrimPrefix(s.env, "OUTBOX_"))
	}
	var out []unknownVariable
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "OUTBOX_") || slices.Contains(known, name) ||
			slices.ContainsFunc(reservedEnvPrefixes, func(p string) bool { return strings.HasPrefix(name, p) }) {
			continue
		}
		u := unknownVariable{Name: name, Suggestion: replacedVariables[name]}
		// Compared without the prefix they all share, so that the
		// prefix does not make distant names look near.
		if c, ok := closest(strings.TrimPrefix(name, "OUTBOX_"), short); ok && u.Suggestion == "" {
			u.Suggestion = "OUTBOX_" + c
		}
		out = append(out, u)
	}
	slices.SortFunc(out, func(a, b unknownVariable) int { return strings.Compare(a.Name, b.Name) })
	return slices.CompactFunc(out, func(a, b unknownVariable) bool { return a.Name == b.Name })
}
