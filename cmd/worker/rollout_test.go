package main

import (
	"os"
	"regexp"
	"testing"
	"time"
)

// rolloutPlan is the pace of a rolling update that fits the worker's
// handoff of partitions, derived from its stale threshold and shutdown
// timeout.
type rolloutPlan struct {
	// grace: the pod's terminationGracePeriodSeconds. The worker's stop
	// (drain the batch, give the partitions back, flush the spans) takes
	// at most the shutdown timeout; 10 s more leaves the kubelet's SIGTERM
	// and the process's exit their time, so that no pod is killed, which
	// would leave its partitions to wait out a term and its claims the
	// stale threshold.
	grace time.Duration
	// minReady: the Deployment's minReadySeconds, at least a term (half
	// the stale threshold): a new pod has been through an ownership term,
	// and taken its share, before the next old one is stopped.
	minReady time.Duration
	// maxSurge 1 and maxUnavailable 0: one pod is added, then one
	// stopped; the relay never runs below its replicas, and one replica's
	// share moves at a time.
	maxSurge, maxUnavailable int
	// pdbMaxUnavailable: node drains stop one replica at a time, each
	// draining on SIGTERM.
	pdbMaxUnavailable int
}

func planRollout(staleAfter, shutdown time.Duration) rolloutPlan {
	return rolloutPlan{
		grace:             shutdown + 10*time.Second,
		minReady:          staleAfter / 2,
		maxSurge:          1,
		maxUnavailable:    0,
		pdbMaxUnavailable: 1,
	}
}

// TestKubernetesRolloutFitsTheHandoff renders deploy/kubernetes and checks
// the rolling update, the grace period and the PodDisruptionBudget
// against what the worker's own settings in the base derive
// (planRollout): a change of OUTBOX_STALE_AFTER or OUTBOX_SHUTDOWN_TIMEOUT
// in worker.env that the manifests do not follow fails here.
func TestKubernetesRolloutFitsTheHandoff(t *testing.T) {
	t.Parallel()
	objs := kubernetesManifests(t)
	dep := one(t, objs, "Deployment")
	c := dep.Spec.Template.Spec.Containers[0]
	env := workerEnv(t, objs, c)
	cfg, _, err := loadConfig("run", nil, func(k string) string { return env[k] }, relayCommand, nil)
	if err != nil {
		t.Fatalf("the worker would refuse the environment of the base: %v", err)
	}
	want := planRollout(cfg.StaleAfter, cfg.ShutdownTimeout)

	if g := dep.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second < want.grace {
		t.Errorf("terminationGracePeriodSeconds = %v, want at least %s (OUTBOX_SHUTDOWN_TIMEOUT %s and 10s)", g, want.grace, cfg.ShutdownTimeout)
	}
	if got := time.Duration(dep.Spec.MinReadySeconds) * time.Second; got < want.minReady {
		t.Errorf("minReadySeconds = %s, want at least a term, %s (half of OUTBOX_STALE_AFTER %s)", got, want.minReady, cfg.StaleAfter)
	}
	ru := dep.Spec.Strategy.RollingUpdate
	if dep.Spec.Strategy.Type != "RollingUpdate" || ru.MaxSurge != want.maxSurge || ru.MaxUnavailable != want.maxUnavailable {
		t.Errorf("strategy %s maxSurge %v maxUnavailable %v, want RollingUpdate %d %d",
			dep.Spec.Strategy.Type, ru.MaxSurge, ru.MaxUnavailable, want.maxSurge, want.maxUnavailable)
	}
	if pdb := one(t, objs, "PodDisruptionBudget"); pdb.Spec.MaxUnavailable != want.pdbMaxUnavailable {
		t.Errorf("PodDisruptionBudget maxUnavailable = %v, want %d", pdb.Spec.MaxUnavailable, want.pdbMaxUnavailable)
	}
}

// The planned pace follows the settings it is derived from.
func TestPlanRollout(t *testing.T) {
	t.Parallel()
	got := planRollout(2*time.Minute, 45*time.Second)
	if got.grace != 55*time.Second || got.minReady != time.Minute {
		t.Errorf("planRollout(2m, 45s) = %+v, want grace 55s, minReady 1m", got)
	}
}

// TestKubernetesImagePinned: the base runs the release image pinned by
// the tag of the newest release in CHANGELOG.md, never a moving tag.
func TestKubernetesImagePinned(t *testing.T) {
	t.Parallel()
	changelog, err := os.ReadFile("../../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^## (v\d+\.\d+\.\d+)\b`).FindSubmatch(changelog)
	if m == nil {
		t.Fatal("CHANGELOG.md has no release section (## vX.Y.Z)")
	}
	c := one(t, kubernetesManifests(t), "Deployment").Spec.Template.Spec.Containers[0]
	if want := "ghcr.io/outboxrelay/outbox:" + string(m[1]); c.Image != want {
		t.Errorf("the worker's image is %q, want %q (the newest release of CHANGELOG.md)", c.Image, want)
	}
}
