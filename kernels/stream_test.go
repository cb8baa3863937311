package kernels

import (
	"bytes"
	"testing"
)

// StreamCopy copies exactly the source bytes at every length and alignment around the
// streamed sizes, and touches nothing past len(src).
func TestStreamCopy(t *testing.T) {
	src := make([]byte, 3*streamMin+200)
	for i := range src {
		src[i] = byte(i*31 + 7)
	}
	for _, n := range []int{0, 1, 63, 64, streamMin - 1, streamMin, streamMin + 1, streamMin + 63, 2*streamMin + 130, 3 * streamMin} {
		for so := 0; so < 3; so++ {
			for do := 0; do < 70; do += 13 {
				buf := make([]byte, n+do+64)
				for i := range buf {
					buf[i] = 0xEE
				}
				if got := StreamCopy(buf[do:], src[so:so+n]); got != n {
					t.Fatalf("n %d: returned %d", n, got)
				}
				StoreFence()
				Prefetch(buf[do:])
				if !bytes.Equal(buf[do:do+n], src[so:so+n]) {
					t.Fatalf("n %d src+%d dst+%d: bytes differ", n, so, do)
				}
				for i, b := range buf {
					if (i < do || i >= do+n) && b != 0xEE {
						t.Fatalf("n %d src+%d dst+%d: byte %d outside the copy written", n, so, do, i)
					}
				}
			}
		}
	}
}

func BenchmarkStreamCopy16K(b *testing.B) {
	src := make([]byte, 16<<10)
	dst := make([]byte, 64<<20)
	b.SetBytes(int64(len(src)))
	off := 0
	for i := 0; i < b.N; i++ {
		if off+len(src) > len(dst) {
			off = 0
		}
		StreamCopy(dst[off:], src)
		off += len(src) + 48
	}
}
