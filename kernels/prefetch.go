package kernels

import "unsafe"

// pageFloats is the granule PrefetchPages touches, in floats: a 4 KiB base page, where a CPU's
// hardware prefetcher stops following a stream.
const pageFloats = 4096 / 4

// PrefetchPages asks for the first cache line of every 4 KiB page v's floats lie in, and for
// its last line, ahead of their use. For a row of a gather whose rows lie far apart (a decode
// step's per-request vectors, each in its own entry of a region mapped with base pages): issued
// for the next row while the current one is added, the page walks and the first line of each
// page overlap that add instead of stalling the next; the hardware prefetcher streams the rest
// of each page. It reads and changes nothing (a prefetch never faults); an empty v does nothing.
func PrefetchPages(v []float32) {
	if len(v) == 0 {
		return
	}
	off := pageOffset(v)
	for i := 0; i < len(v); i = nextPage(i, off) {
		prefetch((*byte)(unsafe.Pointer(&v[i])))
	}
	prefetch((*byte)(unsafe.Pointer(&v[len(v)-1])))
}

// pageOffset is v[0]'s offset in its page, in floats (a float32 slice is 4-byte aligned).
func pageOffset(v []float32) int {
	return int(uintptr(unsafe.Pointer(&v[0])) % (4 * pageFloats) / 4)
}

// nextPage is the index of the first float after v[i]'s page, for v starting off floats into
// a page.
func nextPage(i, off int) int { return ((i+off)/pageFloats+1)*pageFloats - off }

// Follows reports whether v starts where prev ends, rounded up to 64 bytes: v is the next
// cell after prev in a column pool, whose reads the hardware prefetcher is already streaming,
// so PrefetchPages(v) would only compete with it. Empty slices follow nothing.
func Follows(prev, v []float32) bool {
	if len(prev) == 0 || len(v) == 0 {
		return false
	}
	end := (uintptr(unsafe.Pointer(unsafe.SliceData(prev))) + uintptr(4*len(prev)) + 63) &^ 63
	return uintptr(unsafe.Pointer(unsafe.SliceData(v))) == end
}
