package doccheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// root is the repository, from this package's directory.
const root = "../.."

// TestRepositoryLinks checks that every relative link of the README, the
// CHANGELOG, CONTRIBUTING.md, SECURITY.md and docs/*.md names a file or directory that exists, and that
// every #anchor into a Markdown file (the same one included) matches one
// of its headings by GitHub's rules.
func TestRepositoryLinks(t *testing.T) {
	t.Parallel()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append([]string{filepath.Join(root, "README.md"), filepath.Join(root, "CHANGELOG.md"),
		filepath.Join(root, "CONTRIBUTING.md"), filepath.Join(root, "SECURITY.md")}, docs...)
	anchors := map[string]map[string]bool{} // cleaned path -> its anchors
	anchorsOf := func(path string) (map[string]bool, error) {
		if a, ok := anchors[path]; ok {
			return a, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		anchors[path] = Anchors(string(b))
		return anchors[path], nil
	}
	checked := 0
	for _, doc := range docs {
		name, _ := filepath.Rel(root, doc)
		b, err := os.ReadFile(doc)
		if os.IsNotExist(err) && name == "CHANGELOG.md" {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range Links(string(b)) {
			if External(l.Target) {
				continue
			}
			checked++
			path, anchor := Split(l.Target)
			target := doc
			if path != "" {
				target = filepath.Join(filepath.Dir(doc), filepath.FromSlash(path))
			}
			if _, err := os.Stat(target); err != nil {
				t.Errorf("%s:%d: link %q: %s does not exist", name, l.Line, l.Target, path)
				continue
			}
			if anchor == "" || !strings.HasSuffix(target, ".md") {
				continue
			}
			a, err := anchorsOf(filepath.Clean(target))
			if err != nil {
				t.Errorf("%s:%d: link %q: %v", name, l.Line, l.Target, err)
				continue
			}
			if !a[anchor] {
				t.Errorf("%s:%d: link %q: no heading of %s has the anchor #%s", name, l.Line, l.Target, filepath.Base(target), anchor)
			}
		}
	}
	if checked < 50 {
		t.Errorf("checked %d relative links, fewer than expected: is the link pattern broken?", checked)
	}
}
