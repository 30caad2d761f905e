package testenv

import (
	"strings"
	"testing"
)

// WantRefused checks that build (a package's New over a Config) refuses
// each Config of refusals with an error that contains its key: the field
// and its value, such as "BatchSize -1".
func WantRefused[C any](t testing.TB, build func(C) error, refusals map[string]C) {
	t.Helper()
	for want, cfg := range refusals {
		if err := build(cfg); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New(%+v) = %v, want an error containing %q", cfg, err, want)
		}
	}
}
