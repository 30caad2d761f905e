package memlimit

import "runtime/debug"

func setLimit(n int64) int64 { return debug.SetMemoryLimit(n) }
