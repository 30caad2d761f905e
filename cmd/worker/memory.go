package main

import (
	"log/slog"
	"runtime/debug"

	"github.com/outboxrelay/outbox/claim"
	"github.com/outboxrelay/outbox/internal/memlimit"
)

// The worker's memory with a batch of large documents in flight peaks at
// a multiple of OUTBOX_BATCH_BYTES plus a baseline (the claim package's
// BatchBytes says what makes it up; docs/performance.md, Peak RSS, has the
// measured factor and baseline). The model below rounds both up, and leaves batches a share
// of the limit: the rest is the runtime's and the garbage collector's.
const (
	memPerBatchByte = 5
	memBaseline     = 32 << 20
	// memBatchShare is the share of the memory limit that a batch in
	// flight may take, per the model; memSoftShare the share the Go
	// runtime's soft limit is set to, where GOMEMLIMIT does not set it,
	// so that the collector works harder before the kernel kills.
	memBatchShare = 0.8
	memSoftShare  = 0.9
	// minBatchBytes is the least derived bound: a limit too small for it
	// is too small for the worker, whose claim takes one document
	// whatever the bound.
	minBatchBytes = 1 << 20
)

// readMemoryLimit is the memory limit the worker runs under; a variable so
// that the configuration's tests do not depend on the machine's cgroup.
var readMemoryLimit = memlimit.Read

// batchBytesFor is OUTBOX_BATCH_BYTES's auto value under a memory limit
// of limit bytes (0: none): the largest bound whose batch fits in
// memBatchShare of the limit, at most claim.BatchBytesDefault.
func batchBytesFor(limit int64) int {
	if limit <= 0 {
		return claim.BatchBytesDefault
	}
	b := (int64(float64(limit)*memBatchShare) - memBaseline) / memPerBatchByte
	return int(min(max(b, minBatchBytes), claim.BatchBytesDefault))
}

// peakFor is what the model expects the worker's memory to peak at with
// batches bounded by batchBytes.
func peakFor(batchBytes int) int64 { return memPerBatchByte*int64(batchBytes) + memBaseline }

// applyMemoryLimit sets the Go runtime's soft memory limit to
// memSoftShare of a cgroup's limit, unless GOMEMLIMIT set one, and logs
// what the worker runs under.
func applyMemoryLimit(cfg Config, logger *slog.Logger) {
	lim := cfg.MemoryLimit
	if lim.Bytes > 0 && lim.Source != "GOMEMLIMIT" {
		debug.SetMemoryLimit(int64(float64(lim.Bytes) * memSoftShare))
	}
	logger.Info("memory", "limit_bytes", lim.Bytes, "limit_source", lim.Source,
		"soft_limit_bytes", debug.SetMemoryLimit(-1), "batch_bytes", cfg.BatchBytes)
}
