package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// An override is a change an operator makes to the shipped settings, as
// the docs show it: variables (in Kubernetes, a ConfigMap merge in an
// overlay) and flags.
type override struct {
	where   string // the doc and what in it
	env     map[string]string
	args    []string
	refused bool // the docs say the worker refuses it
}

func (o override) String() string {
	var parts []string
	for k, v := range o.env {
		parts = append(parts, k+"="+v)
	}
	slices.Sort(parts)
	return fmt.Sprintf("%s: %s", o.where, strings.Join(append(parts, o.args...), " "))
}

var (
	inlineSetting = regexp.MustCompile("`(OUTBOX_[A-Z_]+)=([^`]+)`")
	timingRow     = regexp.MustCompile("(?m)^\\| `([0-9a-z.]+)`( \\(default\\))? \\| `[^`]+` \\| `[^`]+` \\| (works|refused)")
)

// documentedOverrides reads the overrides the docs show: every setting
// written as `OUTBOX_X=value` in docs/*.md, each on its own; the rows of
// the Timing table of docs/configuration.md (OUTBOX_STALE_AFTER alone,
// and whether it works); its refused pair of a stale threshold and a
// publish timeout; and the commands of its Examples.
func documentedOverrides(t *testing.T) []override {
	t.Helper()
	var out []override
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil || len(docs) == 0 {
		t.Fatalf("no docs: %v", err)
	}
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range inlineSetting.FindAllStringSubmatch(string(b), -1) {
			out = append(out, override{where: filepath.Base(doc), env: map[string]string{m[1]: strings.Trim(m[2], "'")}})
		}
	}
	b, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	conf := string(b)
	rows := timingRow.FindAllStringSubmatch(conf, -1)
	if len(rows) < 4 {
		t.Fatalf("docs/configuration.md: %d rows in the Timing table, want its 5", len(rows))
	}
	for _, m := range rows {
		v := m[1]
		if m[2] != "" { // "1m0s (default)"
			v = strings.TrimSuffix(v, " (default)")
		}
		out = append(out, override{where: "configuration.md Timing", env: map[string]string{"OUTBOX_STALE_AFTER": v}, refused: m[3] == "refused"})
	}
	const pair = "`OUTBOX_STALE_AFTER=15s` with\n`OUTBOX_PUBLISH_TIMEOUT=12s` is refused"
	if !strings.Contains(conf, pair) {
		t.Fatalf("docs/configuration.md no longer says %q: update this test", pair)
	}
	out = append(out, override{where: "configuration.md Timing", env: map[string]string{"OUTBOX_STALE_AFTER": "15s", "OUTBOX_PUBLISH_TIMEOUT": "12s"}, refused: true})

	_, examples, ok := strings.Cut(conf, "\n## Examples\n")
	if !ok {
		t.Fatal("docs/configuration.md has no Examples section")
	}
	n := 0
	for _, line := range strings.Split(strings.ReplaceAll(examples, "\\\n", " "), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "```") {
			continue
		}
		o := override{where: "configuration.md Examples", env: map[string]string{}}
		words := shellWords(t, strings.TrimSuffix(line, "&"))
		i := slices.Index(words, "worker")
		if i < 0 {
			t.Fatalf("configuration.md Examples: %q runs no worker", line)
		}
		for _, w := range words[:i] {
			k, v, ok := strings.Cut(w, "=")
			if !ok {
				t.Fatalf("configuration.md Examples: %q before the command is no VAR=value", w)
			}
			o.env[k] = v
		}
		o.args = words[i+1:]
		if len(o.args) > 0 && o.args[0] == "run" {
			o.args = o.args[1:]
		}
		out = append(out, o)
		n++
	}
	if n == 0 {
		t.Fatal("docs/configuration.md: no command in the Examples")
	}
	return out
}

// shellWords splits a command line into words as sh does for the simple
// lines of the docs: blanks separate words, single quotes group.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	var words []string
	var cur strings.Builder
	inWord, quoted := false, false
	for _, r := range line {
		switch {
		case r == '\'':
			quoted, inWord = !quoted, true
		case (r == ' ' || r == '\t') && !quoted:
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quoted {
		t.Fatalf("unbalanced quote in %q", line)
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// overlayEnv renders an overlay of the Kubernetes base that merges o's
// variables into the worker's ConfigMap, as an operator does, and returns
// the worker container's environment. Variables the base keeps in the
// Secret are set over the rendered environment.
func overlayEnv(t *testing.T, o override) map[string]string {
	t.Helper()
	base, err := filepath.Abs(kubernetesBase)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rel, err := filepath.Rel(dir, base) // kustomize refuses an absolute base
	if err != nil {
		t.Fatal(err)
	}
	secret := map[string]string{}
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\n", rel)
	fmt.Fprintf(&b, "configMapGenerator:\n  - name: outbox-worker\n    behavior: merge\n    literals:\n")
	merged := 0
	for k, v := range o.env {
		if k == "OUTBOX_MONGO_URI" || k == "OUTBOX_AMQP_URL" {
			secret[k] = v
			continue
		}
		fmt.Fprintf(&b, "      - %s\n", strconv.Quote(k+"="+v))
		merged++
	}
	if merged == 0 {
		fmt.Fprintf(&b, "      - %s\n", strconv.Quote("OUTBOX_LOG_LEVEL=info"))
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	objs := kustomizeBuild(t, dir)
	env := workerEnv(t, objs, one(t, objs, "Deployment").Spec.Template.Spec.Containers[0])
	for k, v := range secret {
		env[k] = v
	}
	for k, v := range o.env {
		if env[k] != v {
			t.Fatalf("%s: the overlay renders %s=%q, want %q", o, k, env[k], v)
		}
	}
	return env
}

// TestKubernetesDocumentedOverrides renders the Kubernetes base with each
// override the docs show, as an overlay's ConfigMap merge, and runs the
// worker's configuration check on the result: what the docs say works,
// works on the shipped manifests, and what they say is refused is refused.
// A pinned OUTBOX_PUBLISH_TIMEOUT=30s in worker.env made
// OUTBOX_STALE_AFTER=30s alone, which the docs call enough, a crash loop.
func TestKubernetesDocumentedOverrides(t *testing.T) {
	t.Parallel()
	overrides := documentedOverrides(t)
	staleAlone := false
	for _, o := range overrides {
		if len(o.env) == 1 && o.env["OUTBOX_STALE_AFTER"] == "30s" && !o.refused {
			staleAlone = true
		}
		env := overlayEnv(t, o)
		_, _, err := loadConfig("run", o.args, func(k string) string { return env[k] }, relayCommand, nil)
		switch {
		case o.refused && err == nil:
			t.Errorf("%s: the docs say the worker refuses it, but it accepts it on the shipped manifests", o)
		case !o.refused && err != nil:
			t.Errorf("%s: the docs show it, but on the shipped manifests the worker refuses it: %v", o, err)
		}
	}
	if !staleAlone {
		t.Error("the docs no longer show OUTBOX_STALE_AFTER=30s alone as working; keep the case")
	}
	t.Logf("%d documented overrides checked", len(overrides))
}
