package doccheck

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSlug(t *testing.T) {
	t.Parallel()
	tests := map[string]string{
		"Where duplicates come from":                         "where-duplicates-come-from",
		"Retries: backoff with jitter":                       "retries-backoff-with-jitter",
		"`OUTBOX_BATCH_BYTES` and memory":                    "outbox_batch_bytes-and-memory",
		"Before: the worker of 667a20a":                      "before-the-worker-of-667a20a",
		"Scale-out, before and after":                        "scale-out-before-and-after",
		"Publishing: pipelined confirms, mandatory, returns": "publishing-pipelined-confirms-mandatory-returns",
		"See [the design](design.md) now":                    "see-the-design-now",
		"Ünïcode **bold** 2":                                 "ünïcode-bold-2",
	}
	for in, want := range tests {
		if got := Slug(in); got != want {
			t.Errorf("Slug(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestAnchors(t *testing.T) {
	t.Parallel()
	doc := "# Title\n\n## Peak RSS\n\n```sh\n# not a heading\n```\n\n### Peak RSS\n<a id=\"custom\"></a>\n## Peak RSS ##\n"
	want := map[string]bool{"title": true, "peak-rss": true, "peak-rss-1": true, "peak-rss-2": true, "custom": true}
	if diff := cmp.Diff(want, Anchors(doc)); diff != "" {
		t.Errorf("Anchors (-want +got):\n%s", diff)
	}
}

func TestLinks(t *testing.T) {
	t.Parallel()
	doc := "See [design](docs/design.md#the-claim) and ![img](a.png \"title\").\n" +
		"Not `[code](x.md)`, nor:\n```\n[fenced](y.md)\n```\n" +
		"[ref]: operations.md#memory\n" +
		"[nested [brackets]](z.md) and <a href=\"w.md\">w</a> and [web](https://example.com).\n"
	want := []Link{
		{"docs/design.md#the-claim", 1}, {"a.png", 1}, {"operations.md#memory", 6},
		{"z.md", 7}, {"https://example.com", 7}, {"w.md", 7},
	}
	if diff := cmp.Diff(want, Links(doc)); diff != "" {
		t.Errorf("Links (-want +got):\n%s", diff)
	}
}

func TestExternal(t *testing.T) {
	t.Parallel()
	for target, want := range map[string]bool{
		"https://x.org": true, "mailto:a@b": true, "//cdn.x": true,
		"docs/a.md": false, "#anchor": false, "a.md#b:c": false,
	} {
		if got := External(target); got != want {
			t.Errorf("External(%q) = %v, want %v", target, got, want)
		}
	}
}
