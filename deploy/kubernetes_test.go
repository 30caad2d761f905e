package deploy

import (
	"testing"

	"gopkg.in/yaml.v3"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/resource"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// renderKubernetes renders the Kubernetes base as kustomize build does.
func renderKubernetes(t *testing.T) []*resource.Resource {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), absPath(t, "kubernetes"))
	if err != nil {
		t.Fatalf("kustomize build deploy/kubernetes: %v", err)
	}
	return rm.Resources()
}

// kubernetesNames returns the scrape job the PodMonitor gives the workers
// (the value of its jobLabel on the pods) and the Deployment's name.
func kubernetesNames(t *testing.T) (job, deployment string) {
	t.Helper()
	var podLabels map[string]string
	var jobLabel string
	for _, r := range renderKubernetes(t) {
		switch r.GetKind() {
		case "Deployment":
			deployment = r.GetName()
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
	if deployment == "" || jobLabel == "" {
		t.Fatalf("the Kubernetes base needs a Deployment and a PodMonitor with a jobLabel")
	}
	job = podLabels[jobLabel]
	if job == "" {
		t.Fatalf("the PodMonitor's jobLabel %q is not a label of the worker pods (%v)", jobLabel, podLabels)
	}
	return job, deployment
}
