package memlimit

import (
	"errors"
	"testing"
)

func TestParseCgroup(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in      string
		want    int64
		noLimit bool
		bad     bool
	}{
		{in: "268435456\n", want: 256 << 20},
		{in: "max\n", noLimit: true},
		{in: "9223372036854771712", noLimit: true}, // cgroup v1's "unlimited"
		{in: "lots", bad: true},
	} {
		got, err := parseCgroup(tc.in)
		switch {
		case tc.noLimit:
			if !errors.Is(err, errNoLimit) {
				t.Errorf("parseCgroup(%q) = %d, %v; want no limit", tc.in, got, err)
			}
		case tc.bad:
			if err == nil {
				t.Errorf("parseCgroup(%q) = %d, want an error", tc.in, got)
			}
		case err != nil || got != tc.want:
			t.Errorf("parseCgroup(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestReadPrefersGOMEMLIMIT(t *testing.T) {
	// The runtime reads GOMEMLIMIT at start; SetMemoryLimit stands in.
	old := setLimit(200 << 20)
	defer setLimit(old)
	got := Read(func(k string) string { return map[string]string{"GOMEMLIMIT": "200MiB"}[k] })
	if got.Bytes != 200<<20 || got.Source != "GOMEMLIMIT" {
		t.Errorf("Read with GOMEMLIMIT = %+v, want 200 MiB from GOMEMLIMIT", got)
	}
}
