package kernels

// streamMin is the smallest copy StreamCopy streams: below it the cache-line head and tail
// and the fence cost more than the stores they avoid reading for ownership.
const streamMin = 2048

// StreamCopy copies src into dst[:len(src)] (len(dst) must be at least len(src), and the two
// must not overlap) and returns len(src). Copies of streamMin bytes and more use
// non-temporal stores where the CPU has them (SSE2 on amd64): for data written once and read
// later by another process, as a capture ring's records are, the stores skip reading the
// destination's cache lines and leave the writer's cache alone, as Go's copy does only from
// 1 MiB. The stores are fenced (SFENCE) before it returns, so a store that publishes the bytes
// afterwards (an atomic write position) is ordered after them.
func StreamCopy(dst, src []byte) int {
	n := len(src)
	dst = dst[:n]
	if n < streamMin || !streamCopyLines(dst, src) {
		copy(dst, src)
	}
	return n
}
