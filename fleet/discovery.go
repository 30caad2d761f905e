package fleet

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
)

// DatabaseNameMaxLength is the longest database name MongoDB accepts
// (64 bytes with its terminating zero): it bounds a discovered outbox's
// name.
const DatabaseNameMaxLength = 63

// DiscoveredNameMaxLength bounds the name of a discovered outbox: its
// entry's name, "/", and its database's.
const DiscoveredNameMaxLength = NameMaxLength + 1 + DatabaseNameMaxLength

// systemDatabases are MongoDB's own: never an outbox's, whatever a
// pattern says (a pattern of "*" means every tenant, not the server's
// users or its oplog).
var systemDatabases = []string{"admin", "config", "local"}

// CheckPattern says what is wrong with a pattern of database names, or
// nil: it must be path.Match syntax and name no "/" (no database has
// one).
func CheckPattern(pattern string) error {
	if strings.Contains(pattern, "/") {
		return fmt.Errorf("%q: a database name has no /", pattern)
	}
	if _, err := path.Match(pattern, ""); err != nil {
		return fmt.Errorf("%q: not a pattern (want path.Match syntax: *, ?, [a-z], \\\\ to escape): %v", pattern, err)
	}
	return nil
}

// Matches reports whether the database named database is one of
// pattern's (which CheckPattern accepted): MongoDB's own databases never
// are.
func Matches(pattern, database string) bool {
	if slices.Contains(systemDatabases, database) {
		return false
	}
	ok, err := path.Match(pattern, database)
	return ok && err == nil
}

// ErrUnnameable is the error of a database whose name cannot be part of
// an outbox's name.
var ErrUnnameable = errors.New("cannot name an outbox")

// DiscoveredName is the name of the outbox that relays database for the
// entry named entry: "<entry>/<database>", so that it reads as what it
// is and cannot be any configured name (those have no "/"). The database
// name must read as an outbox name does (lower-case letters, digits, _
// and -), so that the discovered name is as safe in a metric label, a
// URL query and a shell argument; a database that does not is left
// alone (ErrUnnameable), rather than named by some mangling of its name
// that two databases could share.
func DiscoveredName(entry, database string) (string, error) {
	if len(database) > DatabaseNameMaxLength || !namePattern.MatchString(database) {
		return "", fmt.Errorf("database %q %w: want lower-case letters, digits, _ and -, at most %d characters",
			database, ErrUnnameable, DatabaseNameMaxLength)
	}
	return entry + "/" + database, nil
}

// SplitDiscoveredName splits a discovered outbox's name into its entry's
// name and its database's; ok is false for a name that is not one.
func SplitDiscoveredName(name string) (entry, database string, ok bool) {
	entry, database, ok = strings.Cut(name, "/")
	return entry, database, ok && CheckName(entry) == nil && database != ""
}
