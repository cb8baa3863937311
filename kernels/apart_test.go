package kernels

import (
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestApart: for rows, x and y at any 4-byte offsets in their pages, apart's window lies
// inside the scratch, holds d floats and starts at least 256 bytes (mod 4 KiB) from h, x and
// y, half a page from h whenever that is far from x and y.
func TestApart(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	const d = 100
	page := make([]float32, 3*1024)
	scratch := make([]float32, d+ScratchPad+1024)
	off := func(v []float32) uintptr { return uintptr(unsafe.Pointer(&v[0])) & 4095 }
	for range 20000 {
		h, x, y := page[rng.IntN(1024):], page[rng.IntN(1024):], page[rng.IntN(1024):]
		s := scratch[rng.IntN(1024):][:d+ScratchPad]
		w := apart(s, d, h, x, y)
		require.Len(t, w, d)
		start := int(uintptr(unsafe.Pointer(&w[0]))-uintptr(unsafe.Pointer(&s[0]))) / 4
		require.True(t, start >= 0 && start+d <= len(s), "window [%d, %d) outside the scratch", start, start+d)
		ow := off(w)
		require.True(t, far(ow, off(h)) && far(ow, off(x)) && far(ow, off(y)), "window at %d: h %d x %d y %d", ow, off(h), off(x), off(y))
		if half := (off(h) + 2048) & 4095; far(half, off(x)) && far(half, off(y)) {
			require.Equal(t, half, ow)
		}
	}
}
