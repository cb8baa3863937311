package kernels

// streamMin is the smallest copy StreamCopy streams: below it the cache-line head and tail
// and the fence cost more than the stores they avoid reading for ownership.
const streamMin = 2048

// StreamCopy copies src into dst[:len(src)] (len(dst) must be at least len(src), and the two
// must not overlap) and returns len(src). Copies of streamMin bytes and more use
// non-temporal stores where the CPU has them (SSE2 on amd64): for data written once and read
// later by another process, as a capture ring's records are, the stores skip reading the
// destination's cache lines and leave the writer's cache alone, as Go's copy does only from
// 1 MiB. Non-temporal stores are weakly ordered: call StoreFence before the store that
// publishes the bytes (an atomic write position), once for any number of copies.
func StreamCopy(dst, src []byte) int {
	n := len(src)
	dst = dst[:n]
	if n < streamMin || !streamCopyLines(dst, src) {
		copy(dst, src)
	}
	return n
}

// StoreFence orders every StreamCopy before it ahead of every store after it (SFENCE on
// amd64; nothing where StreamCopy only copies).
func StoreFence() { storeFence() }

// Prefetch asks for the cache line holding b[0] ahead of its use; it reads and changes
// nothing, and an empty b does nothing. For a writer about to fill a line of memory it does not
// have (the capture ring's next frame header), so the line's fetch overlaps the work before the
// write instead of stalling it; and for a small record read in place that a streaming loop
// evicts between uses (a request's site entry in a decode step).
func Prefetch(b []byte) {
	if len(b) > 0 {
		prefetch(&b[0])
	}
}
