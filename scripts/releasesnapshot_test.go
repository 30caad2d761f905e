package scripts

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// fakeDist is what goreleaser release --snapshot leaves in dist/, made by
// hand so that each thing release-snapshot.sh checks can be got wrong
// once: an archive, its SBOM, the checksums, the metadata and a worker
// binary (a script that prints what worker version --json would).
type fakeDist struct {
	dir                 string
	archiveFiles        []string
	sbomModules         map[string]string // module -> version the SBOM lists
	noSBOM              bool
	versionJSON         string
	corruptAfterSumming bool
}

const (
	distTag    = "v0.2.0"
	distCommit = "0123456789abcdef0123456789abcdef01234567"
	distDate   = "2026-12-01T10:00:00.123456789Z"
	distDay    = "2026-12-01T10:00:00Z" // the date as the linker stamps it
)

func goodDist(t *testing.T) *fakeDist {
	t.Helper()
	mods := map[string]string{}
	for _, m := range []string{"go.mongodb.org/mongo-driver/v2", "github.com/rabbitmq/amqp091-go"} {
		mods[m] = requiredVersion(t, m)
	}
	return &fakeDist{
		dir:          t.TempDir(),
		archiveFiles: []string{"LICENSE", "README.md", "worker"},
		sbomModules:  mods,
		versionJSON: fmt.Sprintf(`{"version":%q,"revision":%q,"buildDate":%q,"goVersion":"go1.26.8","goos":%q,"goarch":%q}`,
			distTag, distCommit, distDay, runtime.GOOS, runtime.GOARCH),
	}
}

// requiredVersion is the version of module that go.mod requires.
func requiredVersion(t *testing.T, module string) string {
	t.Helper()
	for _, line := range strings.Split(string(readFile(t, "go.mod")), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == module {
			return f[1]
		}
	}
	t.Fatalf("go.mod does not require %s", module)
	return ""
}

func (d *fakeDist) write(t *testing.T) {
	t.Helper()
	archive := "outbox_0.2.0_" + runtime.GOOS + "_" + runtime.GOARCH + ".tar.gz"
	writeTarGz(t, filepath.Join(d.dir, archive), d.archiveFiles)
	sums := map[string]string{archive: ""}
	if !d.noSBOM {
		var pkgs []map[string]string
		for m, v := range d.sbomModules {
			pkgs = append(pkgs, map[string]string{"name": m, "versionInfo": v})
		}
		writeJSON(t, filepath.Join(d.dir, archive+".sbom.json"), map[string]any{"spdxVersion": "SPDX-2.3", "packages": pkgs})
		sums[archive+".sbom.json"] = ""
	}
	var checksums strings.Builder
	for name := range sums {
		b, err := os.ReadFile(filepath.Join(d.dir, name))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.Sum256(b)
		fmt.Fprintf(&checksums, "%s  %s\n", hex.EncodeToString(h[:]), name)
	}
	if err := os.WriteFile(filepath.Join(d.dir, "checksums.txt"), []byte(checksums.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if d.corruptAfterSumming {
		writeTarGz(t, filepath.Join(d.dir, archive), append(d.archiveFiles, "extra"))
	}
	bin := filepath.Join(d.dir, "worker_"+runtime.GOOS+"_"+runtime.GOARCH, "worker")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\n[ \"$1 $2\" = 'version --json' ] || exit 2\necho '" + d.versionJSON + "'\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	writeJSON(t, filepath.Join(d.dir, "metadata.json"), map[string]string{"tag": distTag, "commit": distCommit, "date": distDate})
	writeJSON(t, filepath.Join(d.dir, "artifacts.json"), []map[string]string{
		{"type": "Archive", "path": filepath.Join(d.dir, archive), "goos": runtime.GOOS, "goarch": runtime.GOARCH},
		{"type": "Binary", "path": bin, "goos": runtime.GOOS, "goarch": runtime.GOARCH},
	})
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func writeTarGz(t *testing.T, path string, names []string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz := gzip.NewWriter(f)
	tw := tar.NewWriter(gz)
	for _, name := range names {
		body := []byte("content of " + name + "\n")
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestReleaseSnapshotCheck: release-snapshot.sh passes what a good release
// leaves, and fails each way one can be wrong, naming it.
func TestReleaseSnapshotCheck(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("jq"); err != nil {
		t.Fatal("jq is not on PATH: release-snapshot.sh needs it (apt-get install jq)")
	}
	for name, tc := range map[string]struct {
		spoil func(*fakeDist)
		want  string // "" passes
	}{
		"a good release": {spoil: func(*fakeDist) {}},
		"an archive without LICENSE": {
			spoil: func(d *fakeDist) { d.archiveFiles = []string{"README.md", "worker"} },
			want:  "does not hold LICENSE",
		},
		"an archive without its SBOM": {spoil: func(d *fakeDist) { d.noSBOM = true }, want: "has no SBOM"},
		"an SBOM without the driver": {
			spoil: func(d *fakeDist) { delete(d.sbomModules, "go.mongodb.org/mongo-driver/v2") },
			want:  "does not list go.mongodb.org/mongo-driver/v2",
		},
		"an SBOM with another version": {
			spoil: func(d *fakeDist) { d.sbomModules["github.com/rabbitmq/amqp091-go"] = "v0.0.1" },
			want:  "does not list github.com/rabbitmq/amqp091-go",
		},
		"checksums that do not match": {spoil: func(d *fakeDist) { d.corruptAfterSumming = true }, want: "checksums.txt does not match"},
		"a binary of another version": {
			spoil: func(d *fakeDist) { d.versionJSON = strings.Replace(d.versionJSON, distTag, "devel", 1) },
			want:  "version --json =",
		},
		"a binary of another build date": {
			spoil: func(d *fakeDist) { d.versionJSON = strings.Replace(d.versionJSON, distDay, "unknown", 1) },
			want:  "(the release's tag, commit and date)",
		},
	} {
		d := goodDist(t)
		tc.spoil(d)
		d.write(t)
		cmd := exec.CommandContext(t.Context(), "bash", "scripts/release-snapshot.sh", d.dir)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if tc.want == "" {
			if err != nil || !strings.Contains(string(out), "names "+distTag+", "+distCommit+", "+distDay) {
				t.Errorf("%s: release-snapshot.sh: %v\n%s", name, err, out)
			}
			continue
		}
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("%s: release-snapshot.sh = %v, want it to fail with %q:\n%s", name, err, tc.want, out)
		}
	}
}
