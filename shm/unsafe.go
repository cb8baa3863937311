package shm

// This file and unsafe_linux.go (one mmap call) are the only files of package shm that use
// package unsafe. Every function here takes a byte slice and an offset the caller has already
// bounds-checked; each re-checks the bound so a mistake panics instead of reading out of range.
//
// The files of shmsteer that import unsafe, tests aside (TestUnsafeFilesListed checks this
// list against the tree, both ways):
//
//   - shm/unsafe.go, shm/unsafe_linux.go: the region's atomic words, its views and its mmap;
//   - capture/ring_unsafe.go: the capture ring's shared words, for sync/atomic;
//   - steer/spans_unsafe.go: one comparison of two batches' bytes;
//   - kernels/apart.go, kernels/prefetch.go, kernels/stream_amd64.go: addresses for the
//     scratch placement and the prefetches, and the assembly's pointers;
//   - internal/ccompare/ccompare_cgo.go: the C comparison, for cgo;
//   - capi/*.go: the C ABI, for cgo.

import (
	"sync/atomic"
	"unsafe"
)

// word64 returns the 8-byte-aligned word at b[off:off+8] for use with sync/atomic.
func word64(b []byte, off uint64) *uint64 {
	_ = b[off+7]
	if off&7 != 0 {
		panic("shm: unaligned word64")
	}
	return (*uint64)(unsafe.Pointer(&b[off]))
}

func load64(b []byte, off uint64) uint64     { return atomic.LoadUint64(word64(b, off)) }
func store64(b []byte, off uint64, v uint64) { atomic.StoreUint64(word64(b, off), v) }
func cas64(b []byte, off uint64, old, new uint64) bool {
	return atomic.CompareAndSwapUint64(word64(b, off), old, new)
}
func add64(b []byte, off uint64, delta uint64) uint64 {
	return atomic.AddUint64(word64(b, off), delta)
}

// addrOf is the address of b[off], for the reader descriptor: b is a mapping (never Go heap
// memory), so C may hold the address.
func addrOf(b []byte, off uint64) uint64 {
	_ = b[off]
	return uint64(uintptr(unsafe.Pointer(&b[off])))
}

// stringBytes views the bytes of s without copying; the result must not be written.
func stringBytes(s string) []byte {
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// AsFloat32 views b, whose length is a multiple of 4 and whose start is 4-byte aligned (every
// value in a region is 64-byte aligned), as float32s in the machine's byte order, without
// copying. It returns nil for an empty or misaligned slice.
func AsFloat32(b []byte) []float32 {
	if len(b) < 4 || len(b)%4 != 0 || uintptr(unsafe.Pointer(&b[0]))%4 != 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// cellFloats views a column cell as float32s: the geometry Open validated makes every cell
// non-empty, a multiple of 64 bytes and 64-byte aligned (the pool starts on a page), so
// AsFloat32's checks cannot fail; this is its inlinable form for the decode step's per-site
// call.
func cellFloats(b []byte) []float32 {
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}

// Float32Bytes views f as bytes without copying.
func Float32Bytes(f []float32) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), 4*len(f))
}

// words views b, 8-byte aligned with a length that is a multiple of 8 (the index, the arena),
// as uint64s for sync/atomic.
func words(b []byte) []uint64 {
	if len(b) == 0 {
		return nil
	}
	if len(b)%8 != 0 || uintptr(unsafe.Pointer(&b[0]))%8 != 0 {
		panic("shm: words of a misaligned slice")
	}
	return unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), len(b)/8)
}
