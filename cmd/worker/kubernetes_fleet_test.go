package main

// The fleet example of the Kubernetes manifests (deploy/kubernetes-fleet),
// checked against the worker as the base is (kubernetes_test.go): the
// file it mounts is one the worker accepts, where OUTBOX_FLEET_FILE says,
// and every outbox it lists has its setup Job.

import (
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

const kubernetesFleet = "../../deploy/kubernetes-fleet"

// k8sMounts is the part of a rendered Deployment or Job that mounts
// files: kubernetes_test.go's k8sObject reads no volumes.
type k8sMounts struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec struct {
		Template struct {
			Spec struct {
				Volumes []struct {
					Name      string `yaml:"name"`
					ConfigMap *struct {
						Name string `yaml:"name"`
					} `yaml:"configMap"`
				} `yaml:"volumes"`
				Containers []struct {
					Args         []string `yaml:"args"`
					VolumeMounts []struct {
						Name      string `yaml:"name"`
						MountPath string `yaml:"mountPath"`
					} `yaml:"volumeMounts"`
				} `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

// fleetMounts renders dir and returns its Deployments' and Jobs' mounts
// by object name.
func fleetMounts(t *testing.T, dir string) map[string]k8sMounts {
	t.Helper()
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out := map[string]k8sMounts{}
	for _, r := range rm.Resources() {
		if k := r.GetKind(); k != "Deployment" && k != "Job" {
			continue
		}
		b, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		var m k8sMounts
		if err := yaml.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s %s: %v", r.GetKind(), r.GetName(), err)
		}
		out[m.Metadata.Name] = m
	}
	return out
}

// mountedConfigMap is the ConfigMap that m's first container sees at
// file, and the key that file is, or "" when none is mounted there.
func (m k8sMounts) mountedConfigMap(file string) (name, key string) {
	pod := m.Spec.Template.Spec
	for _, vm := range pod.Containers[0].VolumeMounts {
		if path.Dir(file) != path.Clean(vm.MountPath) {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name == vm.Name && v.ConfigMap != nil {
				return v.ConfigMap.Name, path.Base(file)
			}
		}
	}
	return "", ""
}

// TestKubernetesFleetExample renders the fleet overlay: the worker reads
// a fleet file from a mounted ConfigMap, accepts it with the rest of its
// environment, and each outbox of the file has a setup Job for it alone
// (worker setup takes --outbox with several), reading the same file.
func TestKubernetesFleetExample(t *testing.T) {
	t.Parallel()
	dir, err := filepath.Abs(kubernetesFleet)
	if err != nil {
		t.Fatal(err)
	}
	objs := kustomizeBuild(t, dir)
	mounts := fleetMounts(t, dir)
	relay := one(t, objs, "Deployment")
	relayEnv := workerEnv(t, objs, relay.Spec.Template.Spec.Containers[0])
	file := relayEnv["OUTBOX_FLEET_FILE"]
	if file == "" {
		t.Fatal("the fleet example's worker has no OUTBOX_FLEET_FILE")
	}
	cmName, key := mounts[relay.Metadata.Name].mountedConfigMap(file)
	if cmName == "" {
		t.Fatalf("OUTBOX_FLEET_FILE=%s: no ConfigMap is mounted at %s in the worker", file, path.Dir(file))
	}
	text, ok := named(t, objs, "ConfigMap", cmName).Data[key]
	if !ok {
		t.Fatalf("ConfigMap %s has no key %s, which OUTBOX_FLEET_FILE=%s reads", cmName, key, file)
	}
	// The worker reads the file where the pod has it; here, a copy.
	local := filepath.Join(t.TempDir(), key)
	if err := os.WriteFile(local, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	relayEnv["OUTBOX_FLEET_FILE"] = local
	cfg, _, err := loadConfig("run", nil, func(k string) string { return relayEnv[k] }, relayCommand, nil)
	if err != nil {
		t.Fatalf("the worker would refuse the fleet example: %v", err)
	}
	if len(cfg.Outboxes) < 2 {
		t.Errorf("the fleet example lists %d outboxes (%s), want several: it shows a fleet", len(cfg.Outboxes), outboxNames(cfg.Outboxes))
	}
	checkFleetSetupJobs(t, objs, mounts, cfg.Outboxes, file, cmName)
}

// checkFleetSetupJobs checks that each outbox has one setup Job that
// names it with --outbox and mounts the worker's fleet file, and that no
// Job sets up an outbox the file does not list.
func checkFleetSetupJobs(t *testing.T, objs map[string][]k8sObject, mounts map[string]k8sMounts, outboxes []outboxConfig, file, cmName string) {
	t.Helper()
	names := outboxNames(outboxes)
	jobs := map[string]int{}
	for _, job := range objs["Job"] {
		c := job.Spec.Template.Spec.Containers[0]
		if len(c.Args) != 3 || c.Args[0] != "setup" || c.Args[1] != "--outbox" {
			t.Errorf("Job %s runs worker %q, want worker setup --outbox NAME: the file lists several outboxes", job.Metadata.Name, c.Args)
			continue
		}
		jobs[c.Args[2]]++
		if !slices.Contains(names, c.Args[2]) {
			t.Errorf("Job %s sets up outbox %q, which the fleet file does not list (%s)", job.Metadata.Name, c.Args[2], strings.Join(names, ", "))
		}
		env := workerEnv(t, objs, c)
		if env["OUTBOX_FLEET_FILE"] != file {
			t.Errorf("Job %s: OUTBOX_FLEET_FILE=%q, want the worker's %q", job.Metadata.Name, env["OUTBOX_FLEET_FILE"], file)
		}
		if got, _ := mounts[job.Metadata.Name].mountedConfigMap(file); got != cmName {
			t.Errorf("Job %s mounts ConfigMap %q at %s, want the worker's %s", job.Metadata.Name, got, path.Dir(file), cmName)
		}
		checkPodSecurity(t, "Job "+job.Metadata.Name, job.Spec.Template.Spec)
	}
	for _, name := range names {
		if jobs[name] != 1 {
			t.Errorf("outbox %s has %d setup Jobs, want 1", name, jobs[name])
		}
	}
}
