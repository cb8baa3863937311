//go:build !amd64 || race

package shm

// pinlessGet is off where loads may be reordered with later loads, and under the race detector:
// Reader.Get always pins (see pinless_amd64.go).
const pinlessGet = false
