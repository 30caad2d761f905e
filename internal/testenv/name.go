package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
)

// UniqueNameMaxLen is the length UniqueName keeps to when the prefix allows:
// short enough for a FerretDB database (a PostgreSQL schema whose tables get
// hashed suffixes) and for any AMQP exchange or queue name.
const UniqueNameMaxLen = 38

// UniqueName returns prefix followed by a short form of t.Name() and a random
// suffix, such as "t_claimer_late_write_1f3a9c2e". The result has only
// [a-z0-9_], so it is a valid MongoDB database or collection name and AMQP
// exchange or queue name; it is at most UniqueNameMaxLen long unless the
// prefix alone is too long for that. Prefix is lowercased and sanitized the
// same way.
func UniqueName(t testing.TB, prefix string) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails.
	suffix := hex.EncodeToString(b[:])

	p := sanitizePrefix(prefix)
	name := sanitize(strings.TrimPrefix(t.Name(), "Test"))
	if room := UniqueNameMaxLen - len(p) - len(suffix) - 1; len(name) > room {
		name = strings.TrimRight(name[:max(room, 0)], "_")
	}
	if name == "" {
		return p + suffix
	}
	return p + name + "_" + suffix
}

// sanitize lowercases s and turns each run of characters outside [a-z0-9]
// into one underscore, trimming underscores at both ends.
func sanitize(s string) string {
	var b strings.Builder
	pendingUnderscore := false
	for _, r := range strings.ToLower(s) {
		if ('a' <= r && r <= 'z') || ('0' <= r && r <= '9') {
			if pendingUnderscore && b.Len() > 0 {
				b.WriteByte('_')
			}
			pendingUnderscore = false
			b.WriteRune(r)
			continue
		}
		pendingUnderscore = true
	}
	return b.String()
}

// sanitizePrefix is sanitize that keeps a trailing separator as an
// underscore, so "t_" and "t-" become "t_".
func sanitizePrefix(prefix string) string {
	p := sanitize(prefix)
	if p == "" {
		return ""
	}
	if last := prefix[len(prefix)-1]; (last < 'a' || last > 'z') && (last < 'A' || last > 'Z') && (last < '0' || last > '9') {
		p += "_"
	}
	return p
}
