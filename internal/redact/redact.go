// Package redact hides credentials in URLs before they reach a log line,
// an error or a metric label: the one place every part of the worker, its
// tools and its tests take a printable URL from.
package redact

import (
	"net/url"
	"strings"
)

// URL returns raw with its password replaced by "xxxxx". A string that does
// not parse as scheme://user:password@host (a forgotten scheme or "//", or
// no URL at all) keeps only what follows its last "@", or nothing, since
// what comes before may be a password in another syntax.
func URL(raw string) string {
	u, err := url.Parse(raw)
	// Two "@" mean a password with an unescaped "@" (or "/"), which the
	// parser splits in the wrong place: trust only what follows the last.
	if err == nil && u.Scheme != "" && strings.Count(raw, "@") <= 1 && (u.User != nil || !strings.Contains(raw, "@")) {
		return u.Redacted()
	}
	if i := strings.LastIndex(raw, "@"); i >= 0 {
		if j := strings.Index(raw, "://"); j > 0 && j < i {
			return raw[:j+3] + "<redacted>" + raw[i:]
		}
		return "<redacted>" + raw[i:]
	}
	if i := strings.Index(raw, "://"); i > 0 {
		return raw[:i+3] + "<redacted>"
	}
	return "<redacted>"
}

// Value redacts v if it looks like a URL and returns it unchanged
// otherwise: for settings that may or may not be one.
func Value(v string) string {
	if strings.Contains(v, "://") || strings.Contains(v, "@") {
		return URL(v)
	}
	return v
}
