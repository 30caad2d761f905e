package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestFrom(t *testing.T) {
	t.Parallel()
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	platform := func(goos, goarch string, settings ...debug.BuildSetting) []debug.BuildSetting {
		return append(settings, debug.BuildSetting{Key: "GOOS", Value: goos}, debug.BuildSetting{Key: "GOARCH", Value: goarch})
	}
	for name, tc := range map[string]struct {
		bi      *debug.BuildInfo
		stamped Info
		want    Info
		short   string
	}{
		"release stamped by the linker": {
			bi:      &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}, Settings: platform("linux", "arm64", vcs("0123456789abcdef0123", "false")...)},
			stamped: Info{Version: "v0.1.0", BuildDate: "2026-11-27T21:15:04Z"},
			want:    Info{Version: "v0.1.0", Revision: "0123456789abcdef0123", BuildDate: "2026-11-27T21:15:04Z", GoVersion: "go1.26.0", GOOS: "linux", GOARCH: "arm64"},
			short:   "v0.1.0",
		},
		"build date stamped with an offset, said in UTC": {
			bi:      &debug.BuildInfo{GoVersion: "go1.26.0", Settings: platform("linux", "amd64")},
			stamped: Info{Version: "v0.1.0", BuildDate: "2026-11-27T22:15:04+01:00"},
			want:    Info{Version: "v0.1.0", Revision: Unknown, BuildDate: "2026-11-27T21:15:04Z", GoVersion: "go1.26.0", GOOS: "linux", GOARCH: "amd64"},
		},
		"build date stamped in another form, kept": {
			bi:      &debug.BuildInfo{GoVersion: "go1.26.0", Settings: platform("linux", "amd64")},
			stamped: Info{BuildDate: "27 Nov 2026"},
			want:    Info{Version: VersionDevel, Revision: Unknown, BuildDate: "27 Nov 2026", GoVersion: "go1.26.0", GOOS: "linux", GOARCH: "amd64"},
		},
		"go install of a tagged module": {
			bi:   &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v0.2.0"}, Settings: platform("darwin", "arm64")},
			want: Info{Version: "v0.2.0", Revision: Unknown, BuildDate: Unknown, GoVersion: "go1.26.0", GOOS: "darwin", GOARCH: "arm64"},
		},
		"checkout with local changes": {
			bi:   &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v0.1.1-0.20261127192133-0123456789ab+dirty"}, Settings: platform("linux", "amd64", vcs("0123456789abcdef0123", "true")...)},
			want: Info{Version: "v0.1.1-0.20261127192133-0123456789ab+dirty", Revision: "0123456789abcdef0123-dirty", BuildDate: Unknown, GoVersion: "go1.26.0", GOOS: "linux", GOARCH: "amd64"},
		},
		"no version, a revision": {
			bi:    &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}, Settings: platform("linux", "amd64", vcs("0123456789abcdef0123", "false")...)},
			want:  Info{Version: VersionDevel, Revision: "0123456789abcdef0123", BuildDate: Unknown, GoVersion: "go1.26.0", GOOS: "linux", GOARCH: "amd64"},
			short: "devel-0123456789ab",
		},
		"built with -buildvcs=false": {
			bi:   &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}, Settings: platform("linux", "amd64")},
			want: Info{Version: VersionDevel, Revision: Unknown, BuildDate: Unknown, GoVersion: "go1.26.0", GOOS: "linux", GOARCH: "amd64"},
		},
		"no build information at all: the platform this runs on": {
			stamped: Info{Version: "v1.0.0"},
			want:    Info{Version: "v1.0.0", Revision: Unknown, BuildDate: Unknown, GoVersion: Unknown, GOOS: runtime.GOOS, GOARCH: runtime.GOARCH},
		},
		"container build: stamped, no .git": {
			bi:      &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: platform("linux", "arm64")},
			stamped: Info{Version: "v0.1.0", Revision: "fedcba9876543210", BuildDate: "2026-12-01T10:00:00Z"},
			want:    Info{Version: "v0.1.0", Revision: "fedcba9876543210", BuildDate: "2026-12-01T10:00:00Z", GoVersion: "go1.26.8", GOOS: "linux", GOARCH: "arm64"},
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

// String names every field, in the order worker version prints them.
func TestString(t *testing.T) {
	t.Parallel()
	i := Info{Version: "v0.1.0", Revision: "0123abc", BuildDate: "2026-11-27T21:15:04Z", GoVersion: "go1.26.8", GOOS: "linux", GOARCH: "arm64"}
	const want = "outbox worker v0.1.0 (revision 0123abc, built 2026-11-27T21:15:04Z, go1.26.8 linux/arm64)"
	if got := i.String(); got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

// The test binary itself has build information: Read finds the Go version
// that built it and the platform it runs on.
func TestReadThisBinary(t *testing.T) {
	t.Parallel()
	got := Read()
	if got.GoVersion == Unknown || got.Version == "" {
		t.Errorf("Read() = %+v, want the Go version and a version", got)
	}
	if got.GOOS != runtime.GOOS || got.GOARCH != runtime.GOARCH {
		t.Errorf("Read() = %+v, want GOOS %s and GOARCH %s", got, runtime.GOOS, runtime.GOARCH)
	}
	if !strings.HasPrefix(got.String(), "outbox worker "+got.Version+" ") {
		t.Errorf("String() = %q", got.String())
	}
}
