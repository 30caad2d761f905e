package testenv

import (
	"regexp"
	"strings"
	"testing"
)

var validName = regexp.MustCompile(`^[a-z0-9_]+$`)

func TestUniqueName(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, prefix, wantPrefix string
	}{
		{name: "short", prefix: "t_", wantPrefix: "t_uniquename_short_"},
		{name: "Mixed Case/and-punctuation!", prefix: "ex-", wantPrefix: "ex_uniquename_mixed_case_and_"},
		{name: "a_very_long_subtest_name_that_will_not_fit_in_thirty_eight_characters", prefix: "q_", wantPrefix: "q_uniquename_a_very_long_subt"},
		{name: "no prefix", prefix: "", wantPrefix: "uniquename_no_prefix_"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a, b := UniqueName(t, tt.prefix), UniqueName(t, tt.prefix)
			for _, got := range []string{a, b} {
				if !validName.MatchString(got) {
					t.Errorf("UniqueName = %q, want only [a-z0-9_]", got)
				}
				if len(got) > UniqueNameMaxLen {
					t.Errorf("UniqueName = %q (%d chars), want at most %d", got, len(got), UniqueNameMaxLen)
				}
				if !strings.HasPrefix(got, tt.wantPrefix) {
					t.Errorf("UniqueName = %q, want prefix %q", got, tt.wantPrefix)
				}
			}
			if a == b {
				t.Errorf("two calls returned the same name %q", a)
			}
		})
	}
}

func TestFerretDatabaseName(t *testing.T) {
	t.Parallel()
	a := ferretDatabaseName("/tmp/go-build1/b001/claim.test", "/src/outbox/claim")
	if again := ferretDatabaseName("/tmp/go-build2/b007/claim.test", "/src/outbox/claim"); again != a {
		t.Errorf("same package, another build: %q, want %q (stable across runs)", again, a)
	}
	if other := ferretDatabaseName("/tmp/go-build1/b002/claim.test", "/src/outbox/internal/claim"); other == a {
		t.Errorf("two packages named claim share database %q", a)
	}
	if !strings.HasPrefix(a, "ferret_claim_") || !validName.MatchString(a) {
		t.Errorf("ferretDatabaseName = %q, want ferret_claim_<hash> in [a-z0-9_]", a)
	}
	if long := ferretDatabaseName(strings.Repeat("x", 200)+".test", "/"); len(long) > 63 {
		t.Errorf("ferretDatabaseName = %q (%d chars), longer than a PostgreSQL identifier", long, len(long))
	}
}
