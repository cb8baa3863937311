//go:build amd64 && !race

package shm

// pinlessGet: Reader.Get reads a value without pinning and validates it afterwards (see
// Reader.Get). Sound where loads are not reordered with later loads (amd64's TSO), so that the
// validating load of the horizon comes after every load of the value. Off under the race
// detector, which would report the reads of memory the owner reclaims as races even though the
// validation discards them.
const pinlessGet = true
