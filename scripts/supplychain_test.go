package scripts

import (
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// The image's labels and annotations say the build the worker names: the
// same templates as the ldflags that stamp worker version's version,
// revision and build date, so that `docker inspect` and `worker version`
// of one release agree.
func TestImageSaysTheWorkersBuild(t *testing.T) {
	t.Parallel()
	c := readGoreleaser(t)
	stamped := map[string]string{} // buildinfo variable -> template
	stamp := regexp.MustCompile(`-X github.com/outboxrelay/outbox/internal/buildinfo\.(\w+)=({{[^}]*}})`)
	for _, b := range c.Builds {
		for _, f := range b.Ldflags {
			for _, m := range stamp.FindAllStringSubmatch(f, -1) {
				stamped[m[1]] = m[2]
			}
		}
	}
	want := map[string]string{
		"org.opencontainers.image.version":  stamped["Version"],
		"org.opencontainers.image.revision": stamped["Revision"],
		"org.opencontainers.image.created":  stamped["BuildDate"],
		"org.opencontainers.image.source":   "{{ .GitURL }}",
		"org.opencontainers.image.licenses": licenseSPDX,
	}
	for _, v := range []string{"Version", "Revision", "BuildDate"} {
		if stamped[v] == "" {
			t.Errorf(".goreleaser.yaml: the ldflags do not stamp buildinfo.%s", v)
		}
	}
	for _, d := range c.DockersV2 {
		for key, w := range want {
			if got := d.Labels[key]; got != w {
				t.Errorf(".goreleaser.yaml: image %q: label %s = %q, want %q", d.ID, key, got, w)
			}
			if got := d.Annotations[key]; got != w {
				t.Errorf(".goreleaser.yaml: image %q: annotation %s = %q, want %q", d.ID, key, got, w)
			}
		}
		if d.SBOM != "true" {
			t.Errorf(".goreleaser.yaml: image %q: sbom = %q, want \"true\" (buildx attests the image's SBOM)", d.ID, d.SBOM)
		}
	}
	// The Dockerfile built from source labels the image from the build
	// arguments it stamps the worker with.
	dockerfile := string(readFile(t, "Dockerfile"))
	for label, arg := range map[string]string{
		"org.opencontainers.image.version": "VERSION", "org.opencontainers.image.revision": "REVISION",
		"org.opencontainers.image.created": "BUILD_DATE",
	} {
		if !strings.Contains(dockerfile, label+`="${`+arg+`}"`) {
			t.Errorf("Dockerfile does not label %s with ${%s}", label, arg)
		}
	}
	for _, v := range []string{"Version=${VERSION}", "Revision=${REVISION}", "BuildDate=${BUILD_DATE}"} {
		if !strings.Contains(dockerfile, "internal/buildinfo."+v) {
			t.Errorf("Dockerfile does not stamp buildinfo.%s", v)
		}
	}
}

// A release has an SBOM per archive and signs its checksums and its
// image with cosign, keyless (no key file: the workflow's identity).
func TestReleaseSBOMsAndSignatures(t *testing.T) {
	t.Parallel()
	c := readGoreleaser(t)
	if !slices.ContainsFunc(c.SBOMs, func(s struct {
		ID        string `yaml:"id"`
		Artifacts string `yaml:"artifacts"`
	}) bool {
		return s.Artifacts == "archive"
	}) {
		t.Errorf(".goreleaser.yaml: sboms %+v: none for the archives", c.SBOMs)
	}
	type signer struct {
		what, cmd, artifacts string
		args                 []string
	}
	var signers []signer
	for _, s := range c.Signs {
		signers = append(signers, signer{"signs " + s.ID, s.Cmd, s.Artifacts, s.Args})
	}
	for _, s := range c.DockerSigns {
		signers = append(signers, signer{"docker_signs " + s.ID, s.Cmd, s.Artifacts, s.Args})
	}
	signed := map[string]bool{}
	for _, s := range signers {
		if s.cmd != "cosign" {
			t.Errorf(".goreleaser.yaml: %s signs with %q, want cosign", s.what, s.cmd)
		}
		if slices.ContainsFunc(s.args, func(a string) bool { return strings.Contains(a, "--key") }) {
			t.Errorf(".goreleaser.yaml: %s signs with a key (%v): the release signs keyless", s.what, s.args)
		}
		signed[s.artifacts] = true
	}
	for _, what := range []string{"checksum", "images"} {
		if !signed[what] {
			t.Errorf(".goreleaser.yaml: nothing signs the %s", what)
		}
	}
}

// workflow is the part of a GitHub workflow these tests read.
type workflow struct {
	Permissions map[string]string `yaml:"permissions"`
	Jobs        map[string]struct {
		Permissions map[string]string `yaml:"permissions"`
		Steps       []struct {
			Name string            `yaml:"name"`
			Uses string            `yaml:"uses"`
			Run  string            `yaml:"run"`
			With map[string]string `yaml:"with"`
		} `yaml:"steps"`
	} `yaml:"jobs"`
}

func readWorkflow(t *testing.T, name string) (workflow, string) {
	t.Helper()
	text := string(readFile(t, ".github/workflows/"+name))
	var w workflow
	if err := yaml.Unmarshal([]byte(text), &w); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return w, text
}

// Every action of every workflow is pinned by a full commit hash, with
// the release it is named in a comment (which Dependabot updates with the
// pin); none is local to this repository's mutable refs.
func TestActionsArePinnedByCommit(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join(root, ".github", "workflows", "*.yml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no workflows (%v)", err)
	}
	pinned := regexp.MustCompile(`^\s*(- )?uses: [\w.-]+/[\w./-]+@[0-9a-f]{40} # v\d+\.\d+\.\d+\s*$`)
	uses := regexp.MustCompile(`^\s*(- )?uses:`)
	for _, f := range files {
		name := filepath.Base(f)
		_, text := readWorkflow(t, name)
		n := 0
		for i, line := range strings.Split(text, "\n") {
			if !uses.MatchString(line) {
				continue
			}
			n++
			if !pinned.MatchString(line) {
				t.Errorf("%s:%d: %q is not pinned by a commit with its release named (uses: owner/action@<40 hex> # vX.Y.Z)", name, i+1, strings.TrimSpace(line))
			}
		}
		if n == 0 {
			t.Errorf("%s uses no action: the test reads nothing", name)
		}
	}
}

// The release job has the permissions keyless signing and attestations
// need, and only the release job has them; it attests the archives and
// the image; CI runs govulncheck and the snapshot check.
func TestReleaseWorkflowSignsAndAttests(t *testing.T) {
	t.Parallel()
	w, _ := readWorkflow(t, "release.yml")
	if w.Permissions["contents"] != "read" || len(w.Permissions) != 1 {
		t.Errorf("release.yml: top-level permissions %v, want contents: read alone", w.Permissions)
	}
	rel, ok := w.Jobs["release"]
	if !ok {
		t.Fatal("release.yml has no job release")
	}
	for perm, want := range map[string]string{"contents": "write", "packages": "write", "id-token": "write", "attestations": "write"} {
		if rel.Permissions[perm] != want {
			t.Errorf("release.yml: job release: permission %s = %q, want %q", perm, rel.Permissions[perm], want)
		}
	}
	for name, job := range w.Jobs {
		if name != "release" && job.Permissions["id-token"] != "" {
			t.Errorf("release.yml: job %s may mint OIDC tokens: only the release job signs", name)
		}
	}
	var cosign, syft, checksums, image, records, snapshot bool
	for _, s := range rel.Steps {
		action, _, _ := strings.Cut(s.Uses, "@")
		switch {
		case action == "sigstore/cosign-installer":
			cosign = true
		case action == "anchore/sbom-action/download-syft":
			syft = true
		case action == "actions/attest-build-provenance" && s.With["subject-checksums"] == "dist/checksums.txt":
			checksums = true
		case action == "actions/attest-build-provenance" && s.With["subject-name"] == "ghcr.io/outboxrelay/outbox" &&
			s.With["subject-digest"] != "" && s.With["push-to-registry"] == "true":
			image = true
		case strings.Contains(s.Run, "scripts/release-notes.sh --check"):
			records = true
		case strings.Contains(s.Run, "scripts/release-snapshot.sh dist"):
			snapshot = true
		}
	}
	for what, done := range map[string]bool{
		"installs cosign": cosign, "installs syft": syft, "attests the archives (dist/checksums.txt)": checksums,
		"attests the image by digest, pushed beside it": image, "checks the release records": records,
		"checks what it built (scripts/release-snapshot.sh)": snapshot,
	} {
		if !done {
			t.Errorf("release.yml: the release job never %s", what)
		}
	}

	ci, _ := readWorkflow(t, "ci.yml")
	runs := map[string]bool{}
	for _, job := range ci.Jobs {
		for _, s := range job.Steps {
			runs[strings.TrimSpace(s.Run)] = true
		}
	}
	for _, want := range []string{"make vulncheck", "make release-check", "make release-snapshot"} {
		if !runs[want] {
			t.Errorf("ci.yml: no step runs %q", want)
		}
	}
}

// Dependabot proposes updates of the Go modules (the relay's and the
// public module's), the actions and the Dockerfiles' base images.
func TestDependabotCoversEveryEcosystem(t *testing.T) {
	t.Parallel()
	var cfg struct {
		Version int `yaml:"version"`
		Updates []struct {
			Ecosystem   string   `yaml:"package-ecosystem"`
			Directory   string   `yaml:"directory"`
			Directories []string `yaml:"directories"`
		} `yaml:"updates"`
	}
	if err := yaml.Unmarshal(readFile(t, ".github/dependabot.yml"), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Version != 2 {
		t.Errorf(".github/dependabot.yml: version %d, want 2", cfg.Version)
	}
	got := map[string]map[string]bool{}
	for _, u := range cfg.Updates {
		if got[u.Ecosystem] == nil {
			got[u.Ecosystem] = map[string]bool{}
		}
		for _, d := range append([]string{u.Directory}, u.Directories...) {
			if d != "" {
				got[u.Ecosystem][d] = true
			}
		}
	}
	for _, want := range []struct{ eco, dir, what string }{
		{"gomod", "/", "go.mod"},
		{"gomod", "/" + publicModule, "the public module's go.mod"},
		{"github-actions", "/", ".github/workflows"},
		{"docker", "/", "the Dockerfiles"},
	} {
		if !got[want.eco][want.dir] {
			t.Errorf(".github/dependabot.yml: no %s updates in %q (%s)", want.eco, want.dir, want.what)
		}
	}
}
