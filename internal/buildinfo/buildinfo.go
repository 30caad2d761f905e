// Package buildinfo says which build of the worker runs: its version,
// the VCS revision it was built from, when it was built, the Go version
// that built it and the platform it was built for.
// The worker prints it (worker version), logs it at start, serves it on
// /status and as outbox_build_info, and names its database and broker
// connections with it, so that an operator can tell the replicas of a
// rolling upgrade apart.
package buildinfo

import (
	"runtime"
	"runtime/debug"
	"time"
)

// Version, Revision and BuildDate are stamped into a release build by
// the linker:
//
//	go build -ldflags "-X github.com/outboxrelay/outbox/internal/buildinfo.Version=v0.1.0
//	  -X github.com/outboxrelay/outbox/internal/buildinfo.Revision=<commit>
//	  -X github.com/outboxrelay/outbox/internal/buildinfo.BuildDate=2026-11-27T21:15:04Z"
//
// (.goreleaser.yaml, the Dockerfile and make build do). Empty in any
// other build, whose version then comes from the module (go install
// ...@v0.1.0) or is VersionDevel, whose revision from what go build
// recorded of the checkout (vcs.revision), if it did: a build with
// -buildvcs=false, or from a copy without .git (a container build),
// records none; and whose build date is Unknown (Go records the commit's
// time, not the build's).
var (
	Version   = ""
	Revision  = ""
	BuildDate = ""
)

// VersionDevel is the version of a build that is neither stamped nor
// installed as a tagged module: a checkout built with go build.
const VersionDevel = "devel"

// Unknown stands for a revision or Go version the binary does not carry
// (built outside a VCS checkout, or with -buildvcs=false).
const Unknown = "unknown"

// Info is what a binary knows of its own build.
type Info struct {
	// Version is a semantic version with its leading v (v0.1.0), or
	// VersionDevel.
	Version string `json:"version"`
	// Revision is the VCS commit, with "-dirty" when the work tree had
	// changes that were not committed; Unknown when not recorded.
	Revision string `json:"revision"`
	// BuildDate is when the binary was built, RFC 3339 in UTC
	// (2026-11-27T21:15:04Z) as stamped; Unknown when not stamped. A
	// stamp that is not RFC 3339 is kept as it is.
	BuildDate string `json:"buildDate"`
	// GoVersion is the Go release that built the binary (go1.26.0).
	GoVersion string `json:"goVersion"`
	// GOOS and GOARCH are the platform the binary was built for (linux,
	// amd64).
	GOOS   string `json:"goos"`
	GOARCH string `json:"goarch"`
}

// Read returns this binary's build information.
func Read() Info {
	bi, _ := debug.ReadBuildInfo()
	return from(bi, Info{Version: Version, Revision: Revision, BuildDate: BuildDate})
}

// from is Read's work on given build information and stamped version
// and revision, for the tests.
func from(bi *debug.BuildInfo, stamped Info) Info {
	// The platform the running binary was compiled for, unless the
	// build information says (it does for every build of a main
	// package).
	info := Info{Version: VersionDevel, Revision: Unknown, BuildDate: Unknown, GoVersion: Unknown,
		GOOS: runtime.GOOS, GOARCH: runtime.GOARCH}
	if bi == nil {
		bi = &debug.BuildInfo{}
	}
	if bi.GoVersion != "" {
		info.GoVersion = bi.GoVersion
	}
	var modified bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		case "GOOS":
			info.GOOS = s.Value
		case "GOARCH":
			info.GOARCH = s.Value
		}
	}
	if modified && info.Revision != Unknown {
		info.Revision += "-dirty"
	}
	if stamped.Revision != "" {
		info.Revision = stamped.Revision
	}
	if stamped.BuildDate != "" {
		info.BuildDate = stamped.BuildDate
		if d, err := time.Parse(time.RFC3339, stamped.BuildDate); err == nil {
			info.BuildDate = d.UTC().Format(time.RFC3339)
		}
	}
	switch v := bi.Main.Version; {
	case stamped.Version != "":
		info.Version = stamped.Version
	case v != "" && v != "(devel)":
		// A tagged module installed with go install, or what go build
		// (Go 1.24 and later) derives from the checkout: the tag, or a
		// pseudo-version naming the commit after the latest tag, with
		// +dirty when the work tree had changes.
		info.Version = v
	}
	return info
}

// String is the one line `worker version` prints:
//
//	outbox worker v0.1.0 (revision <commit>, built 2026-11-27T21:15:04Z, go1.26.8 linux/amd64)
func (i Info) String() string {
	return "outbox worker " + i.Version + " (revision " + i.Revision + ", built " + i.BuildDate + ", " +
		i.GoVersion + " " + i.GOOS + "/" + i.GOARCH + ")"
}

// Short is the version, for names that are read by people and bounded
// in length (the MongoDB appName, the RabbitMQ connection name), with the
// revision's first 12 characters when the version is VersionDevel and so
// names no commit: v0.1.0 on a release, devel-abc123def456 otherwise.
func (i Info) Short() string {
	if i.Version != VersionDevel || i.Revision == Unknown {
		return i.Version
	}
	rev := i.Revision
	if len(rev) > 12 {
		rev = rev[:12]
	}
	return i.Version + "-" + rev
}
