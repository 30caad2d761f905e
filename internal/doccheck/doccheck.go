// Package doccheck finds the relative links and #anchors of Markdown
// documents and the anchors their headings make, by GitHub's rules, so
// that a test can check that every link of the README and docs/ resolves.
// It reads the Markdown this repository writes (ATX headings, inline and
// reference links, fenced code), not every dialect.
package doccheck

import (
	"fmt"
	"regexp"
	"strings"
	"unicode"
)

// Link is a link of a document: its target as written and the line it is
// on.
type Link struct {
	Target string
	Line   int
}

var (
	fence      = regexp.MustCompile("^\\s*(```|~~~)")
	heading    = regexp.MustCompile(`^ {0,3}(#{1,6})[ \t]+(.*?)[ \t#]*$`)
	codeSpan   = regexp.MustCompile("`+[^`]*`+")
	inlineLink = regexp.MustCompile(`!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^()\s<>]*(?:\([^()\s]*\)[^()\s<>]*)*)>?(?:\s+"[^"]*")?\s*\)`)
	refDef     = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+"[^"]*")?\s*$`)
	htmlAnchor = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	htmlHref   = regexp.MustCompile(`<a\s+[^>]*href="([^"]+)"`)
)

// lines calls f with each line of doc outside fenced code blocks, and its
// number (from 1).
func lines(doc string, f func(line string, n int)) {
	inFence := ""
	for i, line := range strings.Split(doc, "\n") {
		if m := fence.FindStringSubmatch(line); m != nil {
			switch {
			case inFence == "":
				inFence = m[1]
				continue
			case m[1] == inFence:
				inFence = ""
				continue
			}
		}
		if inFence == "" {
			f(line, i+1)
		}
	}
}

// Links returns the links of doc: inline links and images, reference
// definitions and HTML hrefs, outside code blocks and code spans.
func Links(doc string) []Link {
	var out []Link
	lines(doc, func(line string, n int) {
		line = codeSpan.ReplaceAllString(line, "")
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			out = append(out, Link{Target: m[1], Line: n})
		}
		if m := refDef.FindStringSubmatch(line); m != nil {
			out = append(out, Link{Target: m[1], Line: n})
		}
		for _, m := range htmlHref.FindAllStringSubmatch(line, -1) {
			out = append(out, Link{Target: m[1], Line: n})
		}
	})
	return out
}

// Anchors returns the anchors of doc: one per heading, slugged as GitHub
// does (a repeated slug gets -1, -2, ...), and the ids of HTML anchors.
func Anchors(doc string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	lines(doc, func(line string, _ int) {
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
		m := heading.FindStringSubmatch(line)
		if m == nil {
			return
		}
		slug := Slug(m[2])
		if k := seen[slug]; k > 0 {
			out[fmt.Sprintf("%s-%d", slug, k)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	})
	return out
}

// Slug is the anchor GitHub gives a heading of text: the text as shown
// (link targets, HTML tags and emphasis marks dropped), lower case, with
// every character but letters, digits, spaces, hyphens and underscores
// removed and each space made a hyphen.
func Slug(text string) string {
	text = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(text, "$1")
	text = regexp.MustCompile(`<[^>]+>`).ReplaceAllString(text, "")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Split returns a link target's path and anchor ("" when it has none).
func Split(target string) (path, anchor string) {
	path, anchor, _ = strings.Cut(target, "#")
	return path, anchor
}

// External reports whether target leaves the repository: a URL with a
// scheme (https:, mailto:) or a protocol-relative one.
func External(target string) bool {
	if strings.HasPrefix(target, "//") {
		return true
	}
	scheme, _, ok := strings.Cut(target, ":")
	return ok && regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*$`).MatchString(scheme)
}
