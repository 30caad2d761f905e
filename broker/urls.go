package broker

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/outboxrelay/outbox/internal/redact"
	"github.com/outboxrelay/outbox/internal/rule"
)

// SplitURLs splits a comma-separated list of AMQP URLs (the nodes of a
// cluster, tried in order). A comma separates two URLs only where the next
// one begins with amqp:// or amqps://, so a comma inside a password or a
// query stays part of its URL. Spaces around each URL are dropped; empty
// entries are skipped.
func SplitURLs(list string) []string {
	var out []string
	start := 0
	for i := 0; i < len(list); i++ {
		if list[i] != ',' || !startsURL(list[i+1:]) {
			continue
		}
		if u := strings.TrimSpace(list[start:i]); u != "" {
			out = append(out, u)
		}
		start = i + 1
	}
	if u := strings.TrimSpace(list[start:]); u != "" {
		out = append(out, u)
	}
	return out
}

// startsURL reports whether s, less leading spaces, begins with an AMQP
// scheme.
func startsURL(s string) bool {
	s = strings.TrimLeft(s, " \t")
	for _, scheme := range []string{"amqp://", "amqps://"} {
		if len(s) >= len(scheme) && strings.EqualFold(s[:len(scheme)], scheme) {
			return true
		}
	}
	return false
}

// RedactList is redact.URL of every URL of a comma-separated list, joined
// again with commas: what a log line or an error may show of
// OUTBOX_AMQP_URL.
func RedactList(list string) string {
	urls := SplitURLs(list)
	for i, u := range urls {
		urls[i] = redact.URL(u)
	}
	return strings.Join(urls, ",")
}

// CheckURLs checks list, an AMQP URL or a list of them (SplitURLs), as
// Config.Validate checks Config.URL: each is amqp:// or amqps:// with a
// host. The error says what a URL must be, and which URL of a list is
// not; it shows no URL.
func CheckURLs(list string) error {
	if _, want := badURL(list); want != "" {
		return errors.New("want " + want)
	}
	return nil
}

// urlRule is the rule of a field that holds an AMQP URL or a list of them
// (SplitURLs). The error shows the bad URL, its password redacted.
func urlRule(name, list string) *rule.Error {
	if bad, want := badURL(list); want != "" {
		return &rule.Error{Field: name, Value: bad, Want: want}
	}
	return nil
}

// badURL returns the first URL of list that is not amqp:// or amqps://
// with a host, its password redacted, and what a URL must be; want is
// empty when every URL is good.
func badURL(list string) (bad, want string) {
	const form = "amqp://user:password@host:port/vhost"
	urls := SplitURLs(list)
	if len(urls) == 0 {
		return list, form
	}
	for i, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") || u.Host == "" {
			if len(urls) > 1 {
				return redact.URL(raw), fmt.Sprintf("%s (URL %d of %d)", form, i+1, len(urls))
			}
			return redact.URL(raw), form
		}
	}
	return "", ""
}
