package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/yaml.v3"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/ops"
)

// These tests render deploy/kubernetes as `kustomize build` does and check
// it against the worker itself: its settings, their defaults and its HTTP
// endpoints, so that the manifests cannot drift from the code.

const kubernetesBase = "../../deploy/kubernetes"

// k8sObject is the part of the rendered objects these tests read.
type k8sObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`
	StringData map[string]string `yaml:"stringData"`
	Spec       struct {
		Replicas *int `yaml:"replicas"`
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec podSpec `yaml:"spec"`
		} `yaml:"template"`
		MaxUnavailable any `yaml:"maxUnavailable"`
		// Deployment: the pace of a rollout (rollout_test.go).
		MinReadySeconds int `yaml:"minReadySeconds"`
		Strategy        struct {
			Type          string `yaml:"type"`
			RollingUpdate struct {
				MaxSurge       any `yaml:"maxSurge"`
				MaxUnavailable any `yaml:"maxUnavailable"`
			} `yaml:"rollingUpdate"`
		} `yaml:"strategy"`
		// Service
		ServiceSelector map[string]string `yaml:"-"`
		Ports           []struct {
			Name       string `yaml:"name"`
			Port       int    `yaml:"port"`
			TargetPort any    `yaml:"targetPort"`
		} `yaml:"ports"`
		// PodMonitor
		PodMetricsEndpoints []struct {
			Port string `yaml:"port"`
			Path string `yaml:"path"`
		} `yaml:"podMetricsEndpoints"`
	} `yaml:"spec"`
}

type podSpec struct {
	TerminationGracePeriodSeconds *int `yaml:"terminationGracePeriodSeconds"`
	SecurityContext               struct {
		RunAsNonRoot *bool `yaml:"runAsNonRoot"`
		RunAsUser    *int  `yaml:"runAsUser"`
	} `yaml:"securityContext"`
	Containers []container `yaml:"containers"`
}

type container struct {
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	EnvFrom []struct {
		ConfigMapRef *struct{ Name string } `yaml:"configMapRef"`
		SecretRef    *struct{ Name string } `yaml:"secretRef"`
	} `yaml:"envFrom"`
	Env            []envVar `yaml:"env"`
	LivenessProbe  *probe   `yaml:"livenessProbe"`
	ReadinessProbe *probe   `yaml:"readinessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext struct {
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
}

type envVar struct {
	Name      string `yaml:"name"`
	Value     string `yaml:"value"`
	ValueFrom *struct {
		SecretKeyRef *struct {
			Name string `yaml:"name"`
			Key  string `yaml:"key"`
		} `yaml:"secretKeyRef"`
		FieldRef *struct {
			FieldPath string `yaml:"fieldPath"`
		} `yaml:"fieldRef"`
	} `yaml:"valueFrom"`
}

type probe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"`
	} `yaml:"httpGet"`
	TimeoutSeconds int `yaml:"timeoutSeconds"`
}

// kubernetesManifests renders the base and returns its objects by kind.
func kubernetesManifests(t *testing.T) map[string][]k8sObject {
	t.Helper()
	dir, err := filepath.Abs(kubernetesBase)
	if err != nil {
		t.Fatal(err)
	}
	return kustomizeBuild(t, dir)
}

// kustomizeBuild renders the kustomization in dir (the base, or an
// overlay of it) and returns its objects by kind.
func kustomizeBuild(t *testing.T, dir string) map[string][]k8sObject {
	t.Helper()
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out := map[string][]k8sObject{}
	for _, r := range rm.Resources() {
		b, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		var o k8sObject
		if err := yaml.Unmarshal(b, &o); err != nil {
			t.Fatalf("%s %s: %v", r.GetKind(), r.GetName(), err)
		}
		if o.Kind == "Service" {
			var svc struct {
				Spec struct {
					Selector map[string]string `yaml:"selector"`
				} `yaml:"spec"`
			}
			if err := yaml.Unmarshal(b, &svc); err != nil {
				t.Fatal(err)
			}
			o.Spec.ServiceSelector = svc.Spec.Selector
		}
		out[o.Kind] = append(out[o.Kind], o)
	}
	return out
}

// named is the object of kind named name.
func named(t *testing.T, objs map[string][]k8sObject, kind, name string) k8sObject {
	t.Helper()
	for _, o := range objs[kind] {
		if o.Metadata.Name == name {
			return o
		}
	}
	t.Fatalf("the base renders no %s %s", kind, name)
	return k8sObject{}
}

func one(t *testing.T, objs map[string][]k8sObject, kind string) k8sObject {
	t.Helper()
	if n := len(objs[kind]); n != 1 {
		t.Fatalf("the base renders %d %s objects, want 1", n, kind)
	}
	return objs[kind][0]
}

// workerEnv is the environment the worker container gets: the ConfigMap,
// the Secret and the literal variables, with the pod name for the
// downward API.
func workerEnv(t *testing.T, objs map[string][]k8sObject, c container) map[string]string {
	t.Helper()
	byName := func(kind, name string) k8sObject {
		for _, o := range objs[kind] {
			if o.Metadata.Name == name {
				return o
			}
		}
		t.Fatalf("the container refers to %s %q, which the base does not render", kind, name)
		return k8sObject{}
	}
	secretData := func(o k8sObject) map[string]string {
		m := map[string]string{}
		for k, v := range o.StringData {
			m[k] = v
		}
		for k := range o.Data { // base64: the names are what matter here
			if _, ok := m[k]; !ok {
				m[k] = ""
			}
		}
		return m
	}
	env := map[string]string{}
	for _, ef := range c.EnvFrom {
		switch {
		case ef.ConfigMapRef != nil:
			for k, v := range byName("ConfigMap", ef.ConfigMapRef.Name).Data {
				env[k] = v
			}
		case ef.SecretRef != nil:
			for k, v := range secretData(byName("Secret", ef.SecretRef.Name)) {
				env[k] = v
			}
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			v, ok := secretData(byName("Secret", ref.Name))[ref.Key]
			if !ok {
				t.Errorf("env %s: Secret %s has no key %s", e.Name, ref.Name, ref.Key)
			}
			env[e.Name] = v
		case e.ValueFrom.FieldRef != nil:
			env[e.Name] = "outbox-worker-5d9c7b6f4-x2x7q"
		default:
			t.Errorf("env %s: unexpected valueFrom", e.Name)
		}
	}
	return env
}

// TestKubernetesWorkerSettings checks the ConfigMap, the Secret and the
// container's environment against settings(): every variable is one the
// worker reads, the worker accepts the values, credentials come from the
// Secret, and the grace period and ports follow the configuration.
func TestKubernetesWorkerSettings(t *testing.T) {
	t.Parallel()
	objs := kubernetesManifests(t)
	dep := one(t, objs, "Deployment")
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 3 {
		t.Errorf("Deployment replicas = %v, want 3", dep.Spec.Replicas)
	}
	pod := dep.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("the pod has %d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]

	known := map[string]bool{}
	for _, s := range settings() {
		known[s.env] = true
	}
	for _, kind := range []string{"ConfigMap", "Secret"} {
		for _, o := range objs[kind] {
			for _, m := range []map[string]string{o.Data, o.StringData} {
				for k := range m {
					if !known[k] {
						t.Errorf("%s %s holds %s, which is not a worker setting (cmd/worker/config.go settings())", kind, o.Metadata.Name, k)
					}
				}
			}
		}
	}
	for _, e := range c.Env {
		if !known[e.Name] {
			t.Errorf("the container sets %s, which is not a worker setting", e.Name)
		}
	}

	// Credentials only in the Secrets, and only placeholders in git.
	if setup := named(t, objs, "Secret", "outbox-setup"); !strings.Contains(setup.StringData["OUTBOX_MONGO_URI"], "REPLACE-ME") {
		t.Errorf("Secret outbox-setup: OUTBOX_MONGO_URI is not a marked placeholder (REPLACE-ME): keep real credentials out of git")
	}
	secret := named(t, objs, "Secret", "outbox-worker")
	for _, k := range []string{"OUTBOX_MONGO_URI", "OUTBOX_AMQP_URL", "OUTBOX_HTTP_TOKEN"} {
		v, ok := secret.StringData[k]
		if !ok {
			t.Errorf("Secret %s has no %s", secret.Metadata.Name, k)
		}
		if !strings.Contains(v, "REPLACE-ME") {
			t.Errorf("Secret %s: %s is not a marked placeholder (REPLACE-ME): keep real credentials out of git", secret.Metadata.Name, k)
		}
		if _, ok := one(t, objs, "ConfigMap").Data[k]; ok {
			t.Errorf("the ConfigMap holds %s: credentials belong in the Secret", k)
		}
	}

	env := workerEnv(t, objs, c)
	if i := slices.IndexFunc(c.Env, func(e envVar) bool {
		return e.Name == "OUTBOX_WORKER_ID"
	}); i < 0 || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.FieldRef == nil || c.Env[i].ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Error("OUTBOX_WORKER_ID must come from the pod name (fieldRef metadata.name)")
	}

	cfg, _, err := loadConfig("run", nil, func(k string) string { return env[k] }, relayCommand, nil)
	if err != nil {
		t.Fatalf("the worker would refuse the environment of the base: %v", err)
	}

	grace := 30 * time.Second // the Kubernetes default
	if g := pod.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	if grace <= cfg.ShutdownTimeout {
		t.Errorf("terminationGracePeriodSeconds = %s, want more than OUTBOX_SHUTDOWN_TIMEOUT (%s), or pods are killed mid-drain", grace, cfg.ShutdownTimeout)
	}

	_, portText, err := net.SplitHostPort(cfg.HTTPAddr)
	if err != nil {
		t.Fatal(err)
	}
	httpPort, _ := strconv.Atoi(portText)
	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["http"] != httpPort {
		t.Errorf("container port http = %d, want %d (OUTBOX_HTTP_ADDR %s)", ports["http"], httpPort, cfg.HTTPAddr)
	}
	resolve := func(what string, port any) {
		switch p := port.(type) {
		case string:
			if ports[p] != httpPort {
				t.Errorf("%s: port %q is not the container's HTTP port %d", what, p, httpPort)
			}
		case int:
			if p != httpPort {
				t.Errorf("%s: port %d, want %d (OUTBOX_HTTP_ADDR)", what, p, httpPort)
			}
		default:
			t.Errorf("%s: no port", what)
		}
	}
	for _, pr := range []struct {
		name string
		p    *probe
		path string
	}{{"livenessProbe", c.LivenessProbe, "/healthz"}, {"readinessProbe", c.ReadinessProbe, "/readyz"}} {
		if pr.p == nil || pr.p.HTTPGet == nil {
			t.Errorf("%s: want an httpGet probe on %s", pr.name, pr.path)
			continue
		}
		if pr.p.HTTPGet.Path != pr.path {
			t.Errorf("%s path = %q, want %q", pr.name, pr.p.HTTPGet.Path, pr.path)
		}
		resolve(pr.name, pr.p.HTTPGet.Port)
	}
	// /readyz pings MongoDB with a 2s timeout (ops/server.go): a shorter
	// probe timeout would fail a slow but healthy database.
	if c.ReadinessProbe != nil && c.ReadinessProbe.TimeoutSeconds <= 2 {
		t.Errorf("readinessProbe timeoutSeconds = %d, want more than the 2s MongoDB ping", c.ReadinessProbe.TimeoutSeconds)
	}

	svc := one(t, objs, "Service")
	if len(svc.Spec.Ports) == 0 {
		t.Error("the Service has no port")
	}
	for _, p := range svc.Spec.Ports {
		resolve("Service port "+p.Name, p.TargetPort)
	}
	pm := one(t, objs, "PodMonitor")
	if len(pm.Spec.PodMetricsEndpoints) == 0 {
		t.Error("the PodMonitor has no endpoint")
	}
	for _, e := range pm.Spec.PodMetricsEndpoints {
		resolve("PodMonitor endpoint", e.Port)
		if e.Path != "/metrics" {
			t.Errorf("PodMonitor path = %q, want /metrics", e.Path)
		}
	}
}

// checkPodSecurity checks a pod's hardening and its first container's
// resources: the relay's and the setup Job's alike.
func checkPodSecurity(t *testing.T, what string, pod podSpec) {
	t.Helper()
	if len(pod.Containers) == 0 {
		t.Fatalf("%s: the pod has no container", what)
	}
	c := pod.Containers[0]
	isTrue := func(b *bool) bool { return b != nil && *b }
	if !isTrue(pod.SecurityContext.RunAsNonRoot) {
		t.Errorf("%s: pod securityContext.runAsNonRoot must be true", what)
	}
	// The image's USER is a name; the kubelet refuses runAsNonRoot without
	// a numeric runAsUser.
	if u := pod.SecurityContext.RunAsUser; u == nil || *u == 0 {
		t.Errorf("%s: pod securityContext.runAsUser = %v, want a non-zero uid (the image's nonroot is 65532)", what, u)
	}
	if !isTrue(c.SecurityContext.ReadOnlyRootFilesystem) {
		t.Errorf("%s: container readOnlyRootFilesystem must be true", what)
	}
	if a := c.SecurityContext.AllowPrivilegeEscalation; a == nil || *a {
		t.Errorf("%s: container allowPrivilegeEscalation must be false", what)
	}
	if !slices.Equal(c.SecurityContext.Capabilities.Drop, []string{"ALL"}) {
		t.Errorf("%s: container capabilities.drop = %q, want [ALL]", what, c.SecurityContext.Capabilities.Drop)
	}
	for _, r := range []string{"cpu", "memory"} {
		if c.Resources.Requests[r] == "" {
			t.Errorf("%s: no %s request", what, r)
		}
	}
	if c.Resources.Limits["memory"] == "" {
		t.Errorf("%s: no memory limit", what)
	}
}

// TestKubernetesSetupJob: least privilege by default. The base runs
// worker setup as a Job, connected as the setup user of its own Secret,
// with the relay's database and collection and the relay's image; the
// relay runs with OUTBOX_SETUP=check, so that its user needs no right to
// create anything (deploy/'s tests check the roles).
func TestKubernetesSetupJob(t *testing.T) {
	t.Parallel()
	objs := kubernetesManifests(t)
	job := one(t, objs, "Job")
	if len(job.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("the setup Job's pod has %d containers, want 1", len(job.Spec.Template.Spec.Containers))
	}
	setup := job.Spec.Template.Spec.Containers[0]
	relay := one(t, objs, "Deployment").Spec.Template.Spec.Containers[0]
	if !slices.Equal(setup.Args, []string{"setup"}) {
		t.Errorf("the Job runs worker %q, want worker setup", setup.Args)
	}
	if setup.Image != relay.Image {
		t.Errorf("the Job runs image %q, the relay %q: worker setup must be the relay's version", setup.Image, relay.Image)
	}
	uriSecret := func(c container) string {
		for _, e := range c.Env {
			if e.Name == "OUTBOX_MONGO_URI" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				return e.ValueFrom.SecretKeyRef.Name
			}
		}
		return ""
	}
	if got := uriSecret(setup); got != "outbox-setup" {
		t.Errorf("the Job's OUTBOX_MONGO_URI comes from Secret %q, want outbox-setup (the setup user)", got)
	}
	if got := uriSecret(relay); got != "outbox-worker" {
		t.Errorf("the relay's OUTBOX_MONGO_URI comes from Secret %q, want outbox-worker (the relay's user)", got)
	}

	setupEnv := workerEnv(t, objs, setup)
	setupCfg, _, err := loadConfig("setup", nil, func(k string) string { return setupEnv[k] }, operatorCommand, nil)
	if err != nil {
		t.Fatalf("worker setup would refuse the Job's environment: %v", err)
	}
	relayEnv := workerEnv(t, objs, relay)
	relayCfg, _, err := loadConfig("run", nil, func(k string) string { return relayEnv[k] }, relayCommand, nil)
	if err != nil {
		t.Fatalf("the worker would refuse the relay's environment: %v", err)
	}
	if relayCfg.Setup != setupCheck {
		t.Errorf("the relay runs with OUTBOX_SETUP=%s, want %s: its user may not create collections and indexes", relayCfg.Setup, setupCheck)
	}
	if setupCfg.MongoDatabase != relayCfg.MongoDatabase || setupCfg.MongoCollection != relayCfg.MongoCollection {
		t.Errorf("the Job sets up %s.%s, the relay uses %s.%s", setupCfg.MongoDatabase, setupCfg.MongoCollection, relayCfg.MongoDatabase, relayCfg.MongoCollection)
	}
}

// TestKubernetesPodSecurity checks the hardening and resources of the
// Deployment's pods and the setup Job's, and that the
// PodDisruptionBudget, Service and PodMonitor select the relay's pods.
func TestKubernetesPodSecurity(t *testing.T) {
	t.Parallel()
	objs := kubernetesManifests(t)
	dep := one(t, objs, "Deployment")
	checkPodSecurity(t, "Deployment", dep.Spec.Template.Spec)
	checkPodSecurity(t, "Job", one(t, objs, "Job").Spec.Template.Spec)

	podLabels := dep.Spec.Template.Metadata.Labels
	selects := func(sel map[string]string) bool {
		if len(sel) == 0 {
			return false
		}
		for k, v := range sel {
			if podLabels[k] != v {
				return false
			}
		}
		return true
	}
	if !selects(dep.Spec.Selector.MatchLabels) {
		t.Errorf("the Deployment's selector %v does not match its pods %v", dep.Spec.Selector.MatchLabels, podLabels)
	}
	if pdb := one(t, objs, "PodDisruptionBudget"); !selects(pdb.Spec.Selector.MatchLabels) {
		t.Errorf("the PodDisruptionBudget selects %v, not the worker pods %v", pdb.Spec.Selector.MatchLabels, podLabels)
	}
	if svc := one(t, objs, "Service"); !selects(svc.Spec.ServiceSelector) {
		t.Errorf("the Service selects %v, not the worker pods %v", svc.Spec.ServiceSelector, podLabels)
	}
	if pm := one(t, objs, "PodMonitor"); !selects(pm.Spec.Selector.MatchLabels) {
		t.Errorf("the PodMonitor selects %v, not the worker pods %v", pm.Spec.Selector.MatchLabels, podLabels)
	}
}

// probeStore and probeBroker stand in for MongoDB and RabbitMQ behind the
// worker's real HTTP server.
type probeStore struct{ err error }

func (s probeStore) Ping(context.Context) error { return s.err }
func (s probeStore) Stats(context.Context, time.Time) (events.Stats, error) {
	return events.Stats{}, s.err
}

type probeBroker struct{ err error }

func (b probeBroker) Ready() error { return b.err }

type probeJob struct{}

// probeSamples has no sample: the probes do not read /status.
type probeSamples struct{}

func (probeSamples) Latest() (ops.Sample, bool) { return ops.Sample{}, false }

func (probeJob) LastRun() time.Time  { return time.Time{} }
func (probeJob) Wake() time.Duration { return 0 }
func (probeJob) BatchLimit() int     { return 500 }

// TestKubernetesProbePaths serves the worker's real endpoints and asks
// them what the probes and the PodMonitor ask: the liveness path answers
// 200 even while the broker is down (a not-ready worker must not be
// restarted), the readiness path answers 503 then and 200 when all is up,
// and the metrics path serves the worker's metrics.
func TestKubernetesProbePaths(t *testing.T) {
	t.Parallel()
	objs := kubernetesManifests(t)
	c := one(t, objs, "Deployment").Spec.Template.Spec.Containers[0]
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil {
		t.Fatal("the container needs httpGet liveness and readiness probes")
	}
	metricsPath := one(t, objs, "PodMonitor").Spec.PodMetricsEndpoints[0].Path

	get := func(brokerErr error, path string) (int, string) {
		t.Helper()
		reg := prometheus.NewRegistry()
		metrics.New(reg)
		srv, err := ops.NewServer(ops.ServerConfig{
			Addr: "127.0.0.1:0", WorkerID: "probe-test", Gatherer: reg,
			Outboxes: []ops.Outbox{{Name: "default", Store: probeStore{}, Broker: probeBroker{err: brokerErr},
				Samples: probeSamples{}, Claimer: probeJob{}, Recovery: probeJob{}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = srv.Stop(context.WithoutCancel(t.Context())) }()
		code, body, err := httpGet(t.Context(), "http://"+srv.Addr()+path)
		if err != nil {
			t.Fatal(err)
		}
		return code, string(body)
	}
	down := errors.New("broker unavailable: not connected")
	for _, tc := range []struct {
		name      string
		path      string
		brokerErr error
		want      int
	}{
		{"liveness, broker down", c.LivenessProbe.HTTPGet.Path, down, http.StatusOK},
		{"readiness, broker down", c.ReadinessProbe.HTTPGet.Path, down, http.StatusServiceUnavailable},
		{"readiness, all up", c.ReadinessProbe.HTTPGet.Path, nil, http.StatusOK},
	} {
		if got, body := get(tc.brokerErr, tc.path); got != tc.want {
			t.Errorf("%s: GET %s = %d %s, want %d", tc.name, tc.path, got, body, tc.want)
		}
	}
	if code, body := get(nil, metricsPath); code != http.StatusOK || !strings.Contains(body, "outbox_broker_connected") {
		t.Errorf("GET %s = %d, want 200 with the worker's metrics; got:\n%.300s", metricsPath, code, body)
	}
}
