package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/resource"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// renderKubernetes renders the Kubernetes base as kustomize build does.
func renderKubernetes(t *testing.T) []*resource.Resource {
	t.Helper()
	return renderKustomization(t, absPath(t, "kubernetes"))
}

// renderKustomization renders the kustomization in dir.
func renderKustomization(t *testing.T, dir string) []*resource.Resource {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	return rm.Resources()
}

// kubernetesJob returns the scrape job the PodMonitor of the kustomization
// in dir gives the workers: the value of its jobLabel on the pods.
func kubernetesJob(t *testing.T, dir string) string {
	t.Helper()
	var podLabels map[string]string
	var jobLabel string
	for _, r := range renderKustomization(t, dir) {
		switch r.GetKind() {
		case "Deployment":
			b, err := r.AsYAML()
			if err != nil {
				t.Fatal(err)
			}
			var d struct {
				Spec struct {
					Template struct {
						Metadata struct {
							Labels map[string]string `yaml:"labels"`
						} `yaml:"metadata"`
					} `yaml:"template"`
				} `yaml:"spec"`
			}
			if err := yaml.Unmarshal(b, &d); err != nil {
				t.Fatalf("Deployment: %v", err)
			}
			podLabels = d.Spec.Template.Metadata.Labels
		case "PodMonitor":
			v, err := r.GetString("spec.jobLabel")
			if err != nil {
				t.Fatalf("PodMonitor: %v", err)
			}
			jobLabel = v
		}
	}
	if podLabels == nil || jobLabel == "" {
		t.Fatalf("%s needs a Deployment and a PodMonitor with a jobLabel", dir)
	}
	job := podLabels[jobLabel]
	if job == "" {
		t.Fatalf("the PodMonitor's jobLabel %q is not a label of the worker pods (%v)", jobLabel, podLabels)
	}
	return job
}

// TestRulesSurviveNamePrefix renders an overlay of the base with a
// namePrefix and a nameSuffix, as operators write them: every object is
// renamed, yet the scrape job the rules select is the same, and the rules
// the overlay ships still select it and name no object. A rule that wrote
// the Deployment's name would never fire under such an overlay.
func TestRulesSurviveNamePrefix(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	base, err := filepath.Rel(dir, absPath(t, "kubernetes")) // kustomize refuses an absolute base
	if err != nil {
		t.Fatal(err)
	}
	overlay := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n" +
		"namePrefix: prod-\nnameSuffix: -eu\nnamespace: payments\nresources:\n  - " + base + "\n"
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(overlay), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, want := kubernetesJob(t, dir), kubernetesJob(t, absPath(t, "kubernetes")); got != want {
		t.Fatalf("the overlay's scrape job is %q, the base's %q", got, want)
	}
	job := kubernetesJob(t, dir)
	var rules int
	for _, r := range renderKustomization(t, dir) {
		if !strings.HasPrefix(r.GetName(), "prod-") {
			t.Errorf("%s %s: not renamed by the overlay", r.GetKind(), r.GetName())
		}
		if r.GetKind() != "PrometheusRule" {
			continue
		}
		b, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		var pr struct {
			Spec ruleGroups `yaml:"spec"`
		}
		if err := yaml.Unmarshal(b, &pr); err != nil {
			t.Fatal(err)
		}
		for _, g := range pr.Spec.Groups {
			for _, rl := range g.Rules {
				rules++
				sels, err := selectors(rl.Expr)
				if err != nil {
					t.Fatalf("%s: %v", rl.Alert, err)
				}
				for _, s := range sels {
					for _, m := range s.matchers {
						if m.Name == "job" && m.Value != job {
							t.Errorf("%s: selects job %q under the overlay, whose workers are job %q", rl.Alert, m.Value, job)
						}
						if objectNameLabels[m.Name] {
							t.Errorf("%s: matches %s, which the overlay renamed", rl.Alert, m)
						}
					}
				}
			}
		}
	}
	if rules == 0 {
		t.Fatal("the overlay renders no PrometheusRule with rules")
	}
}
