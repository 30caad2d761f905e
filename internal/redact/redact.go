// Package redact hides credentials in URLs before they reach a log line,
// an error or a metric label: the one place every part of the worker, its
// tools and its tests take a printable URL from.
package redact

import (
	"net/url"
	"strings"
)

// hidden stands for a password or a query value that was removed.
const hidden = "xxxxx"

// URL returns raw with its password and every query value replaced by
// "xxxxx". Query values go too because a URI's options may carry secrets
// (MongoDB's tlsCertificateKeyFilePassword, authMechanismProperties with a
// session token, an AMQP URL's certificate paths): no list of dangerous
// names would stay complete, and the option names that are kept say
// enough to recognise the URI. A string that does not parse as
// scheme://user:password@host (a forgotten scheme or "//", or no URL at
// all) keeps only what follows its last "@" and comes before its first
// "?", or nothing, since what comes before may be a password in another
// syntax.
func URL(raw string) string {
	u, err := url.Parse(raw)
	// Two "@" mean a password with an unescaped "@" (or "/"), which the
	// parser splits in the wrong place: trust only what follows the last.
	if err == nil && u.Scheme != "" && strings.Count(raw, "@") <= 1 && (u.User != nil || !strings.Contains(raw, "@")) {
		u.RawQuery = query(u.RawQuery)
		return u.Redacted()
	}
	return unparsed(raw)
}

// query returns raw's keys with each value replaced by "xxxxx", in raw's
// order. A part without "=" may be a value on its own and is hidden too.
func query(raw string) string {
	if raw == "" {
		return ""
	}
	parts := strings.Split(raw, "&")
	for i, p := range parts {
		if key, _, ok := strings.Cut(p, "="); ok {
			parts[i] = key + "=" + hidden
		} else {
			parts[i] = hidden
		}
	}
	return strings.Join(parts, "&")
}

// unparsed redacts a string that is no well-formed URL. Its query starts
// at its first "?": a "?" in a password would make that cut too early,
// which hides more, never less; cut at the last "@" instead, a value
// holding an "@" would show its tail.
func unparsed(raw string) string {
	suffix := ""
	if i := strings.Index(raw, "?"); i >= 0 {
		raw, suffix = raw[:i], "?<redacted>"
	}
	if i := strings.LastIndex(raw, "@"); i >= 0 {
		if j := strings.Index(raw, "://"); j > 0 && j < i {
			return raw[:j+3] + "<redacted>" + raw[i:] + suffix
		}
		return "<redacted>" + raw[i:] + suffix
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
