// Package memlimit reads the memory limit a process runs under: the Go
// runtime's soft limit when GOMEMLIMIT sets one, else the cgroup's (a
// container's `resources.limits.memory`).
package memlimit

import (
	"errors"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// Limit is a memory limit and where it was read.
type Limit struct {
	// Bytes is the limit; 0 when none was found.
	Bytes int64
	// Source names where: "GOMEMLIMIT", a cgroup file, or "" for none.
	Source string
}

// cgroupFiles are where cgroup v2 and v1 state a memory limit.
var cgroupFiles = []string{
	"/sys/fs/cgroup/memory.max",
	"/sys/fs/cgroup/memory/memory.limit_in_bytes",
}

// noLimitV1 is at or above what cgroup v1 writes for "no limit" (the
// largest page-aligned int64).
const noLimitV1 = math.MaxInt64 &^ (1<<12 - 1)

// Read returns the limit: GOMEMLIMIT's when it is set, else the first
// cgroup file's that states one.
func Read(getenv func(string) string) Limit {
	if getenv("GOMEMLIMIT") != "" {
		if n := debug.SetMemoryLimit(-1); n > 0 && n < math.MaxInt64 {
			return Limit{Bytes: n, Source: "GOMEMLIMIT"}
		}
	}
	for _, f := range cgroupFiles {
		if n, err := readCgroup(f); err == nil && n > 0 {
			return Limit{Bytes: n, Source: f}
		}
	}
	return Limit{}
}

var errNoLimit = errors.New("no limit")

// readCgroup parses a cgroup memory limit file: a number of bytes, or
// "max" (v2) or a huge number (v1) for none.
func readCgroup(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return parseCgroup(string(b))
}

func parseCgroup(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "max" {
		return 0, errNoLimit
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, err
	}
	if n >= noLimitV1 {
		return 0, errNoLimit
	}
	return n, nil
}
