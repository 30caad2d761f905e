package deploy

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"gopkg.in/yaml.v3"
)

var update = flag.Bool("update", false, "rewrite kubernetes/prometheusrule.yaml from prometheus/outbox-rules.yml")

const (
	ruleFile       = "prometheus/outbox-rules.yml"
	ruleTestFile   = "prometheus/outbox-rules.test.yml"
	prometheusRule = "kubernetes/prometheusrule.yaml"
	operationsDoc  = "../docs/operations.md"
	runbookBase    = "https://github.com/outboxrelay/outbox/blob/main/docs/operations.md#"
)

// prometheusRuleHeader precedes the rule file, indented under spec, in
// kubernetes/prometheusrule.yaml. kustomize cannot embed a file into a
// custom resource, so the file is generated, comments and all, and
// TestPrometheusRule fails when it is not what the rule file makes.
const prometheusRuleHeader = `# GENERATED from deploy/prometheus/outbox-rules.yml; do not edit. After
# changing the rule file: go test ./deploy -run TestPrometheusRule -update
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: outbox-worker
  labels:
    app.kubernetes.io/name: outbox-worker
    app.kubernetes.io/part-of: outbox
spec:
`

// ruleGroups is the part of a rule file the tests read.
type ruleGroups struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []rule `yaml:"rules"`
	} `yaml:"groups"`
}

type rule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func loadRules(t *testing.T) []rule {
	t.Helper()
	var g ruleGroups
	decodeFile(t, ruleFile, yaml.Unmarshal, &g)
	var rules []rule
	for _, grp := range g.Groups {
		rules = append(rules, grp.Rules...)
	}
	if len(rules) == 0 {
		t.Fatalf("%s has no rules", ruleFile)
	}
	return rules
}

// wrapRules returns kubernetes/prometheusrule.yaml as the rule file makes it.
func wrapRules(ruleFile []byte) []byte {
	var b bytes.Buffer
	b.WriteString(prometheusRuleHeader)
	for _, line := range strings.SplitAfter(string(ruleFile), "\n") {
		if strings.TrimSpace(line) != "" {
			b.WriteString("  ")
		}
		b.WriteString(line)
	}
	return b.Bytes()
}

// TestPrometheusRule checks that the PrometheusRule in the Kubernetes base
// is the rule file: byte for byte as generated, and as kustomize renders it.
func TestPrometheusRule(t *testing.T) {
	t.Parallel()
	src := readFile(t, ruleFile)
	want := wrapRules(src)
	if *update {
		if err := os.WriteFile(prometheusRule, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got := readFile(t, prometheusRule)
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is not generated from %s; run: go test ./deploy -run TestPrometheusRule -update\n%s",
			prometheusRule, ruleFile, cmp.Diff(string(want), string(got)))
	}

	// What kustomize renders must still be the rule file's groups.
	var file map[string]any
	if err := yaml.Unmarshal(src, &file); err != nil {
		t.Fatal(err)
	}
	var rendered []map[string]any
	for _, r := range renderKubernetes(t) {
		if r.GetKind() == "PrometheusRule" {
			m, err := r.Map()
			if err != nil {
				t.Fatal(err)
			}
			rendered = append(rendered, m)
		}
	}
	if len(rendered) != 1 {
		t.Fatalf("the Kubernetes base renders %d PrometheusRules, want 1", len(rendered))
	}
	spec, _ := rendered[0]["spec"].(map[string]any)
	if diff := cmp.Diff(normalize(t, file), normalize(t, spec)); diff != "" {
		t.Errorf("rendered PrometheusRule spec differs from %s (-file +rendered):\n%s", ruleFile, diff)
	}
}

// readFile returns the content of the file name.
func readFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// decodeFile reads the file name into v with unmarshal: json.Unmarshal or
// yaml.Unmarshal.
func decodeFile(t *testing.T, name string, unmarshal func([]byte, any) error, v any) {
	t.Helper()
	if err := unmarshal(readFile(t, name), v); err != nil {
		t.Fatalf("parse %s: %v", name, err)
	}
}

// normalize round-trips v through JSON, so that two YAML decoders' numbers
// and maps compare equal.
func normalize(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPromtool runs the rules' unit tests. In CI a missing promtool is a
// failure: make test installs it first (scripts/servers.sh, Debian
// package prometheus).
func TestPromtool(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool is not installed (apt-get install prometheus); CI must run the alert rules' tests")
		}
		t.Skip("promtool is not installed (apt-get install prometheus): the alert rules' unit tests did not run")
	}
	for _, args := range [][]string{
		{"check", "rules", ruleFile},
		{"test", "rules", ruleTestFile},
	} {
		out, err := exec.CommandContext(t.Context(), promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// nonWorkerMetrics are the series the rules may use that the worker does
// not export, each with where it comes from.
var nonWorkerMetrics = map[string]string{
	"up":                              "Prometheus, per scrape target",
	"kube_pod_container_status_ready": "kube-state-metrics",
}

// objectNameLabels are the labels of kube-state-metrics (and of the
// PodMonitor's targets) that carry the name of a Kubernetes object. A rule
// that matches one by value breaks silently under an overlay's namePrefix
// or nameSuffix.
var objectNameLabels = map[string]bool{
	"deployment": true, "replicaset": true, "statefulset": true, "daemonset": true, "pod": true, "poddisruptionbudget": true, "service": true,
}

// TestRulesQueryWorkerMetrics checks every rule's expression: it parses,
// it queries only metrics the worker exports (or the few above) with
// labels they have, its job matches the Kubernetes base, and it names no
// Kubernetes object.
func TestRulesQueryWorkerMetrics(t *testing.T) {
	t.Parallel()
	exported := workerMetrics(t)
	job := kubernetesJob(t, absPath(t, "kubernetes"))
	used := map[string]bool{}
	for _, r := range loadRules(t) {
		sels, err := selectors(r.Expr)
		if err != nil {
			t.Errorf("%s: %v", r.Alert, err)
			continue
		}
		for _, s := range sels {
			used[s.name] = true
			for _, m := range s.matchers {
				if objectNameLabels[m.Name] {
					t.Errorf("%s: matches %s, the name of a Kubernetes object, which an overlay's namePrefix changes", r.Alert, m)
				}
			}
			if _, ok := nonWorkerMetrics[s.name]; ok {
				for _, m := range s.matchers {
					if m.Name == "job" && m.Value != job {
						t.Errorf("%s: selects job %q, but the PodMonitor sets job %q", r.Alert, m.Value, job)
					}
				}
				continue
			}
			lbls, ok := exported[s.name]
			if !ok {
				t.Errorf("%s: queries %s, which the worker does not export", r.Alert, s.name)
				continue
			}
			for _, l := range s.labelNames() {
				if !lbls[l] && !targetLabels[l] {
					t.Errorf("%s: uses label %q of %s, which has labels %v", r.Alert, l, s.name, keys(lbls))
				}
			}
		}
	}
	// The alerts docs/operations.md describes must watch these.
	for _, m := range []string{
		"outbox_stale_processing_events", "outbox_oldest_new_event_age_seconds",
		"outbox_events_failed_total", "outbox_events_released_total", "outbox_broker_connected",
		"outbox_claims_lost_total", "outbox_job_errors_total", "up",
		"outbox_partitions_owned", "outbox_claim_runs_total", "kube_pod_container_status_ready",
	} {
		if !used[m] {
			t.Errorf("no rule queries %s", m)
		}
	}
}

// TestRulesRunbooks checks that every alert has a severity, a summary and
// a runbook_url pointing at its own section of docs/operations.md.
func TestRulesRunbooks(t *testing.T) {
	t.Parallel()
	doc := readFile(t, operationsDoc)
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#{2,4} (.+)$`).FindAllStringSubmatch(string(doc), -1) {
		anchors[githubAnchor(m[1])] = true
	}
	for _, r := range loadRules(t) {
		if r.Alert == "" {
			continue
		}
		if s := r.Labels["severity"]; s != "warning" && s != "critical" {
			t.Errorf("%s: severity %q, want warning or critical", r.Alert, s)
		}
		for _, a := range []string{"summary", "description"} {
			if strings.TrimSpace(r.Annotations[a]) == "" {
				t.Errorf("%s: no %s annotation", r.Alert, a)
			}
		}
		want := runbookBase + githubAnchor(r.Alert)
		if got := r.Annotations["runbook_url"]; got != want {
			t.Errorf("%s: runbook_url %q, want %q", r.Alert, got, want)
		}
		if !anchors[githubAnchor(r.Alert)] {
			t.Errorf("%s: docs/operations.md has no section headed %q", r.Alert, r.Alert)
		}
	}
}

// githubAnchor is the anchor GitHub gives a Markdown heading.
func githubAnchor(heading string) string {
	h := strings.ToLower(strings.TrimSpace(heading))
	h = regexp.MustCompile(`[^a-z0-9 _-]`).ReplaceAllString(h, "")
	return strings.ReplaceAll(h, " ", "-")
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// selector is one vector selector of a query.
type selector struct {
	name     string
	matchers []*labels.Matcher
	grouping []string // labels the enclosing aggregations group by
}

func (s selector) labelNames() []string {
	var out []string
	for _, m := range s.matchers {
		if m.Name != model.MetricNameLabel {
			out = append(out, m.Name)
		}
	}
	return append(out, s.grouping...)
}

func (s selector) String() string { return fmt.Sprintf("%s%v", s.name, s.labelNames()) }

// absPath makes a path relative to this package absolute.
func absPath(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
