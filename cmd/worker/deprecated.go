package main

import (
	"log/slog"
	"slices"
	"strings"
)

// deprecatedVariables are settings a release renamed, by their new
// names. The old name keeps working for the period docs/upgrading.md
// gives: the worker reads it where the new one is unset, and warns at
// every start. Then it moves to replacedVariables, which only suggest the
// new name. None is deprecated now.
var deprecatedVariables = map[string]string{}

// withDeprecated returns getenv reading, for each new name of renamed
// that is unset, the value of its old name.
func withDeprecated(getenv func(string) string, renamed map[string]string) func(string) string {
	if len(renamed) == 0 {
		return getenv
	}
	oldOf := make(map[string]string, len(renamed))
	for old, name := range renamed {
		oldOf[name] = old
	}
	return func(name string) string {
		if v := getenv(name); v != "" {
			return v
		}
		if old, ok := oldOf[name]; ok {
			return getenv(old)
		}
		return ""
	}
}

// warnDeprecated warns about each old name of renamed that environ sets,
// and returns environ without them, for warnUnknownVariables: they are
// read, not unknown.
func warnDeprecated(logger *slog.Logger, environ []string, renamed map[string]string) []string {
	return slices.DeleteFunc(slices.Clone(environ), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		use, ok := renamed[name]
		if ok {
			logger.Warn("deprecated environment variable: it still works, but a later release removes it; set the new one instead (docs/upgrading.md)",
				"variable", name, "use", use)
		}
		return ok
	})
}
