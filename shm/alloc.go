package shm

import "math/bits"

// allocator hands out 64-byte-aligned extents of the arena. It lives in the owner's private
// memory: only the single writer allocates, so it needs no synchronization and no shared
// state a crash could leave half-written. Freed extents are coalesced with free neighbours and
// kept in power-of-two size bins; the space above the highest extent ever handed out is a bump
// region that freed extents at its edge fall back into.
type allocator struct {
	size    uint64 // arena bytes
	top     uint64 // [top, size) has never been handed out, or has been given back
	used    uint64 // bytes handed out and not yet freed
	byStart map[uint64]uint64
	byEnd   map[uint64]uint64
	// bins[b] holds the starts of free extents of 2^b to 2^(b+1)-1 units; pos maps a start to
	// its index there, so any extent leaves its bin in O(1) when it is coalesced.
	bins [64][]uint64
	pos  map[uint64]int
}

func newAllocator(size uint64) *allocator {
	return &allocator{size: size, byStart: map[uint64]uint64{}, byEnd: map[uint64]uint64{}, pos: map[uint64]int{}}
}

func binOf(n uint64) int { return bits.Len64(n/blobAlign) - 1 }

// free bytes, counting both free extents and the bump region.
func (a *allocator) free() uint64 { return a.size - a.used }

// alloc returns the offset of n free bytes (n a multiple of 64), or false. limit caps the bytes
// in use after the allocation, which keeps the delete reserve for deletion markers.
func (a *allocator) alloc(n, limit uint64) (uint64, bool) {
	if n == 0 || n%blobAlign != 0 || a.used+n > limit || a.used+n > a.size {
		return 0, false
	}
	for b := binOf(n); b < len(a.bins); b++ {
		for i := len(a.bins[b]) - 1; i >= 0; i-- {
			start := a.bins[b][i]
			sz := a.byStart[start]
			if sz < n {
				continue // only the lowest bin holds extents smaller than n
			}
			a.remove(start, sz)
			if sz > n {
				a.insert(start+n, sz-n)
			}
			a.used += n
			return start, true
		}
	}
	if a.size-a.top >= n {
		off := a.top
		a.top += n
		a.used += n
		return off, true
	}
	return 0, false
}

// release gives back an extent handed out by alloc, merging it with free neighbours.
func (a *allocator) release(off, n uint64) {
	a.used -= n
	if start, ok := a.byEnd[off]; ok {
		sz := a.byStart[start]
		a.remove(start, sz)
		off, n = start, n+sz
	}
	if sz, ok := a.byStart[off+n]; ok {
		a.remove(off+n, sz)
		n += sz
	}
	if off+n == a.top {
		a.top = off
		return
	}
	a.insert(off, n)
}

func (a *allocator) insert(off, n uint64) {
	a.byStart[off] = n
	a.byEnd[off+n] = off
	b := binOf(n)
	a.pos[off] = len(a.bins[b])
	a.bins[b] = append(a.bins[b], off)
}

func (a *allocator) remove(off, n uint64) {
	delete(a.byStart, off)
	delete(a.byEnd, off+n)
	b := binOf(n)
	i, last := a.pos[off], len(a.bins[b])-1
	a.bins[b][i] = a.bins[b][last]
	a.pos[a.bins[b][i]] = i
	a.bins[b] = a.bins[b][:last]
	delete(a.pos, off)
}
