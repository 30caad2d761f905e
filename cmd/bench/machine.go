package main

import (
	"bufio"
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// machine describes where the run happens: CPUs, memory, Go, and the
// database behind the MongoDB URI. RabbitMQ's version is added by the raw
// broker stage, from the connection's server properties.
func (b *bench) machine(ctx context.Context) Machine {
	m := Machine{
		CPUs:      runtime.NumCPU(),
		CPUModel:  procField("/proc/cpuinfo", "model name"),
		GoVersion: runtime.Version(),
	}
	if kb, err := strconv.Atoi(strings.Fields(procField("/proc/meminfo", "MemTotal") + " 0")[0]); err == nil {
		m.MemoryMB = kb / 1024
	}
	if v, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = "Linux " + strings.TrimSpace(string(v))
	}

	var info bson.M
	_ = b.client.Database("admin").RunCommand(ctx, bson.D{{Key: "buildInfo", Value: 1}}).Decode(&info)
	switch v := toString(info["ferretdbVersion"]); {
	case b.ferret:
		// Embedded FerretDB reports "unknown": its version file is only
		// filled in by its own build, so take the module's version.
		m.Database = "FerretDB " + moduleVersion("github.com/FerretDB/FerretDB")
	case v != "unknown":
		m.Database = "FerretDB " + v
	default:
		m.Database = "MongoDB " + toString(info["version"])
	}
	if b.ferret {
		m.Database += " (embedded, PostgreSQL backend)"
		if conn, err := pgx.Connect(ctx, b.cfg.PostgresURL); err == nil {
			var v string
			if conn.QueryRow(ctx, "SHOW server_version").Scan(&v) == nil {
				m.PostgreSQL = "PostgreSQL " + v
			}
			_ = conn.Close(ctx)
		}
	}
	return m
}

// moduleVersion is the version of a module built into the harness.
func moduleVersion(path string) string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, d := range info.Deps {
			if d.Path == path {
				return d.Version
			}
		}
	}
	return "(version unknown)"
}

// procField returns the value of the first "key: value" line of a /proc
// file, or "".
func procField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func toString(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return "unknown"
}
