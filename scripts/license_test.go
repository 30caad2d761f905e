package scripts

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// root is the repository, from this package's directory.
const root = ".."

// licenseSPDX is the SPDX identifier of LICENSE, which the image's labels
// and annotations name.
const licenseSPDX = "Apache-2.0"

// goreleaserConfig is the part of .goreleaser.yaml these tests read.
type goreleaserConfig struct {
	Builds []struct {
		ID      string   `yaml:"id"`
		Ldflags []string `yaml:"ldflags"`
	} `yaml:"builds"`
	Archives []struct {
		ID    string   `yaml:"id"`
		Files []string `yaml:"files"`
	} `yaml:"archives"`
	DockersV2 []struct {
		ID          string            `yaml:"id"`
		Dockerfile  string            `yaml:"dockerfile"`
		ExtraFiles  []string          `yaml:"extra_files"`
		Labels      map[string]string `yaml:"labels"`
		Annotations map[string]string `yaml:"annotations"`
		SBOM        string            `yaml:"sbom"`
	} `yaml:"dockers_v2"`
	SBOMs []struct {
		ID        string `yaml:"id"`
		Artifacts string `yaml:"artifacts"`
	} `yaml:"sboms"`
	Signs []struct {
		ID        string   `yaml:"id"`
		Cmd       string   `yaml:"cmd"`
		Artifacts string   `yaml:"artifacts"`
		Args      []string `yaml:"args"`
	} `yaml:"signs"`
	DockerSigns []struct {
		ID        string   `yaml:"id"`
		Cmd       string   `yaml:"cmd"`
		Artifacts string   `yaml:"artifacts"`
		Args      []string `yaml:"args"`
	} `yaml:"docker_signs"`
}

func readGoreleaser(t *testing.T) goreleaserConfig {
	t.Helper()
	var c goreleaserConfig
	if err := yaml.Unmarshal(readFile(t, ".goreleaser.yaml"), &c); err != nil {
		t.Fatalf(".goreleaser.yaml: %v", err)
	}
	if len(c.Archives) == 0 || len(c.DockersV2) == 0 || len(c.Builds) == 0 {
		t.Fatalf(".goreleaser.yaml has %d builds, %d archives, %d images: want each", len(c.Builds), len(c.Archives), len(c.DockersV2))
	}
	return c
}

func readFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// LICENSE is the Apache License 2.0, whole: its title, its last section
// and the appendix that says how to apply it.
func TestLicenseIsApache2(t *testing.T) {
	t.Parallel()
	text := string(readFile(t, "LICENSE"))
	for _, want := range []string{
		"Apache License\n                           Version 2.0, January 2004",
		"TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION",
		"9. Accepting Warranty or Additional Liability.",
		"END OF TERMS AND CONDITIONS",
		"APPENDIX: How to apply the Apache License to your work.",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("LICENSE lacks %q: it is not the whole Apache License 2.0", want)
		}
	}
}

// Every release archive carries LICENSE, and the image carries it as a
// file and names it in its labels.
func TestReleaseCarriesTheLicense(t *testing.T) {
	t.Parallel()
	c := readGoreleaser(t)
	for _, a := range c.Archives {
		if !slices.Contains(a.Files, "LICENSE") {
			t.Errorf(".goreleaser.yaml: archive %q does not carry LICENSE (files: %v)", a.ID, a.Files)
		}
	}
	copyLicense := regexp.MustCompile(`(?m)^COPY\s+(--from=\S+\s+)?\S*LICENSE\s+/usr/share/doc/outbox/LICENSE$`)
	for _, d := range c.DockersV2 {
		if got := d.Labels["org.opencontainers.image.licenses"]; got != licenseSPDX {
			t.Errorf(".goreleaser.yaml: image %q: label org.opencontainers.image.licenses = %q, want %q", d.ID, got, licenseSPDX)
		}
		if !slices.Contains(d.ExtraFiles, "LICENSE") {
			t.Errorf(".goreleaser.yaml: image %q: extra_files %v lack LICENSE, which its Dockerfile copies", d.ID, d.ExtraFiles)
		}
		if !copyLicense.Match(readFile(t, d.Dockerfile)) {
			t.Errorf("%s does not copy LICENSE to /usr/share/doc/outbox/LICENSE", d.Dockerfile)
		}
	}
	dockerfile := readFile(t, "Dockerfile")
	if !copyLicense.Match(dockerfile) {
		t.Error("Dockerfile does not copy LICENSE to /usr/share/doc/outbox/LICENSE")
	}
	if !strings.Contains(string(dockerfile), `org.opencontainers.image.licenses="`+licenseSPDX+`"`) {
		t.Errorf("Dockerfile does not label the image org.opencontainers.image.licenses=%q", licenseSPDX)
	}
}

// The public module is published on its own (a module's zip holds only
// its own directory): it carries the same LICENSE, so that the terms
// reach whoever gets it from the module proxy.
func TestPublicModuleCarriesTheLicense(t *testing.T) {
	t.Parallel()
	if got, want := readFile(t, filepath.Join(publicModule, "LICENSE")), readFile(t, "LICENSE"); !bytes.Equal(got, want) {
		t.Errorf("%s/LICENSE differs from LICENSE: copy it", publicModule)
	}
}
