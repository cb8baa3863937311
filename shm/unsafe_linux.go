package shm

// With unsafe.go, the only file of package shm that uses package unsafe: the mapping's address
// for mmap(MAP_FIXED).

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// parkMapping replaces the mapping b in place with private anonymous memory of the same size,
// readable, and writable if writable: one mmap(MAP_FIXED), so that no moment leaves the range
// unmapped. A thread still reading b reads zeros from then on, and one still writing it writes
// private memory no one reads, instead of faulting; the shared pages go with the old mapping.
func parkMapping(b []byte, writable bool) error {
	if len(b) == 0 {
		return nil
	}
	prot := unix.PROT_READ
	if writable {
		prot |= unix.PROT_WRITE
	}
	_, err := unix.MmapPtr(-1, 0, unsafe.Pointer(unsafe.SliceData(b)), uintptr(len(b)), prot,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED)
	return err
}
