package buildinfo

import (
	"runtime/debug"
	"testing"
)

func TestFrom(t *testing.T) {
	t.Parallel()
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	for name, tc := range map[string]struct {
		bi      *debug.BuildInfo
		stamped Info
		want    Info
		short   string
	}{
		"release stamped by the linker": {
			bi:      &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}, Settings: vcs("0123456789abcdef0123", "false")},
			stamped: Info{Version: "v0.1.0"},
			want:    Info{Version: "v0.1.0", Revision: "0123456789abcdef0123", GoVersion: "go1.26.0"},
			short:   "v0.1.0",
		},
		"go install of a tagged module": {
			bi:   &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v0.2.0"}},
			want: Info{Version: "v0.2.0", Revision: Unknown, GoVersion: "go1.26.0"},
		},
		"checkout with local changes": {
			bi:   &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v0.1.1-0.20261127192133-0123456789ab+dirty"}, Settings: vcs("0123456789abcdef0123", "true")},
			want: Info{Version: "v0.1.1-0.20261127192133-0123456789ab+dirty", Revision: "0123456789abcdef0123-dirty", GoVersion: "go1.26.0"},
		},
		"no version, a revision": {
			bi:    &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}, Settings: vcs("0123456789abcdef0123", "false")},
			want:  Info{Version: VersionDevel, Revision: "0123456789abcdef0123", GoVersion: "go1.26.0"},
			short: "devel-0123456789ab",
		},
		"built with -buildvcs=false": {
			bi:   &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}},
			want: Info{Version: VersionDevel, Revision: Unknown, GoVersion: "go1.26.0"},
		},
		"no build information at all": {
			stamped: Info{Version: "v1.0.0"},
			want:    Info{Version: "v1.0.0", Revision: Unknown, GoVersion: Unknown},
		},
		"container build: stamped, no .git": {
			bi:      &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			stamped: Info{Version: "v0.1.0", Revision: "fedcba9876543210"},
			want:    Info{Version: "v0.1.0", Revision: "fedcba9876543210", GoVersion: "go1.26.8"},
		},
	} {
		got := from(tc.bi, tc.stamped)
		if got != tc.want {
			t.Errorf("%s: from = %+v, want %+v", name, got, tc.want)
		}
		if tc.short != "" && got.Short() != tc.short {
			t.Errorf("%s: Short() = %q, want %q", name, got.Short(), tc.short)
		}
	}
}

// The test binary itself has build information: Read finds the Go version
// that built it.
func TestReadThisBinary(t *testing.T) {
	t.Parallel()
	got := Read()
	if got.GoVersion == Unknown || got.Version == "" {
		t.Errorf("Read() = %+v, want the Go version and a version", got)
	}
	if got.String() == "" {
		t.Error("String() is empty")
	}
}
