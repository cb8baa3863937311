//go:build !linux

package bench

import "time"

// threadCPU reports the thread clock unavailable: CPUOp falls back to wall time.
func threadCPU() (time.Duration, bool) { return 0, false }
