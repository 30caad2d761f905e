package main

import (
	"bytes"
	"context"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestCommandHelp checks that -h, --help and `help <command>` print the
// command's flags, every setting it reads with its variable and default,
// on stdout, and exit 0.
func TestCommandHelp(t *testing.T) {
	t.Parallel()
	own := map[string][]string{
		"run":     nil,
		"stats":   {"--json"},
		"requeue": {"--id ID", "--ids-from FILE", "--type TYPE", "--all", "--yes", "--dry-run"},
		"skip":    {"--id ID", "--by NAME", "--reason TEXT", "--dry-run"},
		"discard": {"--id ID", "--by NAME", "--reason TEXT", "--dry-run"},
		"show":    {"--id ID"},
		"pause":   {"--type TYPE", "--by NAME", "--reason TEXT"},
		"resume":  {"--type TYPE", "--by NAME", "--reason TEXT"},
	}
	for cmd, flags := range own {
		for _, args := range [][]string{{cmd, "--help"}, {cmd, "-h"}, {"help", cmd}} {
			t.Run(strings.Join(args, " "), func(t *testing.T) {
				t.Parallel()
				got := runBounded(t, args, nil)
				if got.code != 0 {
					t.Errorf("run(%q) = %d, want 0; stderr:\n%s", args, got.code, got.stderr)
				}
				if got.stderr != "" {
					t.Errorf("stderr = %q, want nothing", got.stderr)
				}
				if !strings.HasPrefix(got.stdout, "usage: worker "+cmd+" [flags]\n") {
					t.Errorf("stdout does not start with the command's usage line:\n%s", got.stdout)
				}
				for _, f := range flags {
					if !strings.Contains(got.stdout, "\n  "+f+"\n") {
						t.Errorf("help of %s does not list %q:\n%s", cmd, f, got.stdout)
					}
				}
				kind := relayCommand
				if cmd != "run" {
					kind = operatorCommand
				}
				for _, s := range settings() {
					line := "  --" + s.flag + " (" + s.env + ", default "
					if listed := strings.Contains(got.stdout, line); listed != (kind == relayCommand || s.forOperatorCommands) {
						t.Errorf("help of %s lists %s: %v, want %v", cmd, s.env, listed, !listed)
					}
				}
			})
		}
	}
}

func TestHelpShowsDefaults(t *testing.T) {
	t.Parallel()
	got := runBounded(t, []string{"run", "--help"}, nil)
	for _, want := range []string{
		"  --batch-size (OUTBOX_BATCH_SIZE, default 500)\n",
		"  --batch-bytes (OUTBOX_BATCH_BYTES, default auto)\n",
		"  --ordering (OUTBOX_ORDERING, default aggregate)\n",
		"  --worker-id (OUTBOX_WORKER_ID, default <hostname>-<pid>)\n",
		"  --amqp-url (OUTBOX_AMQP_URL, default amqp://guest:xxxxx@localhost:5672/)\n",
		"  --trace-parent (OUTBOX_TRACE_PARENT, default link)\n",
		"Tracing is off unless OTEL_TRACES_EXPORTER=otlp",
	} {
		if !strings.Contains(got.stdout, want) {
			t.Errorf("run --help lacks %q:\n%s", want, got.stdout)
		}
	}
}

// TestUnknownFlagSuggests checks that a mistyped flag exits 2 and names
// the flag it was probably meant to be, and that a flag like none names
// none.
func TestUnknownFlagSuggests(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"run", "--bach-size", "5"}, "unknown flag --bach-size; did you mean --batch-size?"},
		{[]string{"--bach-size=5"}, "unknown flag --bach-size; did you mean --batch-size?"},
		{[]string{"run", "--stale-afer", "1m"}, "unknown flag --stale-afer; did you mean --stale-after?"},
		{[]string{"stats", "--jsn"}, "unknown flag --jsn; did you mean --json?"},
		{[]string{"requeue", "--dryrun"}, "unknown flag --dryrun; did you mean --dry-run?"},
		{[]string{"run", "--colour", "red"}, "unknown flag --colour\n"},
		{[]string{"stat"}, `unknown command "stat"; did you mean stats?`},
		{[]string{"relay"}, `unknown command "relay"` + "\n"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			got := runBounded(t, tt.args, nil)
			if got.code != 2 {
				t.Errorf("run(%q) = %d, want 2", tt.args, got.code)
			}
			if !strings.Contains(got.stderr, tt.want) {
				t.Errorf("stderr lacks %q:\n%s", tt.want, got.stderr)
			}
		})
	}
}

func TestClosest(t *testing.T) {
	t.Parallel()
	names := []string{"batch-size", "batch-bytes", "stale-after", "json", "dry-run"}
	tests := []struct {
		name, want string
		ok         bool
	}{
		{"bach-size", "batch-size", true},
		{"batch-byte", "batch-bytes", true},
		{"batchsize", "batch-size", true},
		{"jsno", "json", true},
		{"ordering", "", false},
		{"x", "", false},
	}
	for _, tt := range tests {
		got, ok := closest(tt.name, names)
		if got != tt.want || ok != tt.ok {
			t.Errorf("closest(%q) = %q, %v, want %q, %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
	if d := editDistance("kitten", "sitting"); d != 3 {
		t.Errorf("editDistance(kitten, sitting) = %d, want 3", d)
	}
}

func TestUnknownVariables(t *testing.T) {
	t.Parallel()
	environ := []string{
		"PATH=/usr/bin",
		"OUTBOX_BATCH_SIZE=10",       // a setting
		"OUTBOX_BATCHSIZE=5",         // a typo of one
		"OUTBOX_ORDERNG=none",        // another
		"OUTBOX_TEST_MONGO_URI=x",    // the tests'
		"OUTBOX_E2E_EVENTS=100",      // the end-to-end tests'
		"OUTBOX_BENCH_AMQP_URL=x",    // the benchmark's
		"OUTBOX_SOMETHING_ELSE=1",    // nothing near
		"OUTBOX_PPROF=true",          // replaced by a setting
		"OUTBOX_BATCHSIZE=6",         // listed once
		"outbox_batch_size=1",        // not OUTBOX_
		"CONSUMER_QUEUE=outbox-demo", // the demo consumer's
	}
	want := []unknownVariable{
		{Name: "OUTBOX_BATCHSIZE", Suggestion: "OUTBOX_BATCH_SIZE"},
		{Name: "OUTBOX_ORDERNG", Suggestion: "OUTBOX_ORDERING"},
		{Name: "OUTBOX_PPROF", Suggestion: "OUTBOX_PPROF_ADDR"},
		{Name: "OUTBOX_SOMETHING_ELSE"},
	}
	if diff := cmp.Diff(want, unknownVariables(environ)); diff != "" {
		t.Errorf("unknownVariables (-want +got):\n%s", diff)
	}
}

func TestWarnUnknownVariables(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	warnUnknownVariables(slog.New(slog.NewJSONHandler(&buf, nil)), []string{"OUTBOX_BATCHSIZE=5", "OUTBOX_TEST_AMQP_URL=x"})
	out := buf.String()
	for _, want := range []string{`"level":"WARN"`, `"variable":"OUTBOX_BATCHSIZE"`, `"did_you_mean":"OUTBOX_BATCH_SIZE"`} {
		if !strings.Contains(out, want) {
			t.Errorf("warning lacks %s: %s", want, out)
		}
	}
	if strings.Contains(out, "OUTBOX_TEST_AMQP_URL") || strings.Count(out, "\n") != 1 {
		t.Errorf("want exactly one warning, for OUTBOX_BATCHSIZE: %s", out)
	}
}

// TestRunWarnsUnknownVariables checks that `worker run` itself warns, at
// start, and goes on: its context is over before it starts, so it stops
// at once, after the warning.
func TestRunWarnsUnknownVariables(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	env := map[string]string{
		"OUTBOX_BATCHSIZE":  "5",
		"OUTBOX_HTTP_ADDR":  "127.0.0.1:0",
		"OUTBOX_MONGO_URI":  "mongodb://" + listenCounting(t).addr() + "/",
		"OUTBOX_AMQP_URL":   "amqp://guest:guest@" + listenCounting(t).addr() + "/",
		"OUTBOX_LOG_FORMAT": "json",
	}
	var stdout, stderr bytes.Buffer
	code := run(ctx, nil, envOf(env), environOf(env), &stdout, &stderr)
	if code == 2 {
		t.Fatalf("run = 2: an unknown variable must not stop the worker; stderr:\n%s", stderr.String())
	}
	if !strings.Contains(stderr.String(), `"did_you_mean":"OUTBOX_BATCH_SIZE"`) {
		t.Errorf("no warning about OUTBOX_BATCHSIZE; stderr:\n%s", stderr.String())
	}
}

// TestReservedVariablesOfTheRepository checks the rule of unknownVariables
// against the repository: every OUTBOX_ variable that a program, script
// or manifest of it reads or sets is a worker setting or starts with a
// reserved prefix, so that the worker does not warn about variables the
// project itself uses. (Tests may name made-up variables; _test.go files
// are left out.)
func TestReservedVariablesOfTheRepository(t *testing.T) {
	t.Parallel()
	known := map[string]bool{}
	for _, s := range settings() {
		known[s.env] = true
	}
	name := regexp.MustCompile(`\bOUTBOX_[A-Z0-9_]*[A-Z0-9]\b`)
	root := "../.."
	found := map[string]string{} // variable -> a file naming it
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if base := d.Name(); path != root && (strings.HasPrefix(base, ".") && base != ".ci" || base == "results" || base == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		ext := filepath.Ext(path)
		scanned := slices.Contains([]string{".go", ".sh", ".yml", ".yaml"}, ext) ||
			slices.Contains([]string{"Makefile", "Dockerfile", "run"}, d.Name())
		if strings.HasSuffix(path, "_test.go") || !scanned {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, v := range name.FindAllString(string(b), -1) {
			found[v] = path
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) < len(known) {
		t.Fatalf("found %d OUTBOX_ variables in the repository, fewer than the %d settings: is the walk broken?", len(found), len(known))
	}
	for v, path := range found {
		// A replaced setting is named to be warned about, with its successor.
		if known[v] || replacedVariables[v] != "" || slices.ContainsFunc(reservedEnvPrefixes, func(p string) bool { return strings.HasPrefix(v, p) }) {
			continue
		}
		t.Errorf("%s names %s, which is no worker setting and has no reserved prefix %q: the worker would warn about it", path, v, reservedEnvPrefixes)
	}
}
