package kernels_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/kernels"
)

// FuzzSumAddRows holds the fused sum-and-add to what it replaces, on every path: Sum2 into a
// scratch row, then AddRows with s = 1, bit for bit, for row lengths
// 0–4096 (the 32-float block, the 8-float loop and the scalar tail), 0–17 rows and independent
// unaligned starts of h, x and y, guards either side of h checked.
func FuzzSumAddRows(f *testing.F) {
	envPath(f) // the test cache keys on the path chosen at init (env_test.go)
	f.Add(uint16(4096), uint8(16), uint8(0), uint8(0), uint8(0), float32(0.5), float32(1), uint64(1))
	f.Add(uint16(4095), uint8(3), uint8(1), uint8(15), uint8(7), float32(-0.37), float32(1), uint64(2))
	f.Add(uint16(71), uint8(4), uint8(7), uint8(3), uint8(1), float32(1), float32(-2), uint64(3))
	f.Add(uint16(0), uint8(2), uint8(0), uint8(0), uint8(0), float32(2), float32(1), uint64(4))
	f.Add(uint16(5), uint8(0), uint8(0), uint8(0), uint8(0), float32(2), float32(1), uint64(5))
	f.Fuzz(func(t *testing.T, n uint16, rows, offH, offX, offY uint8, a, b float32, seed uint64) {
		d := int(n) % 4097
		nr := int(rows) % 18
		if !finite32(a) || !finite32(b) || math.Abs(float64(a)) > 1e4 || math.Abs(float64(b)) > 1e4 {
			return // keeps the sum inside float32: overflow is TestSpecialValues'
		}
		r := rand.New(rand.NewPCG(seed, uint64(d)))
		h0, x0, y0 := randVals(r, nr*d, 1e30), randVals(r, d, 1e30), randVals(r, d, 1e30)
		oh := int(offH % 16)
		x, _ := offsetCopy(x0, int(offX%16))
		y, _ := offsetCopy(y0, int(offY%16))
		orig := kernels.Path()
		t.Cleanup(func() { require.NoError(t, kernels.SetPath(orig)) })
		for _, p := range kernels.Paths() {
			require.NoError(t, kernels.SetPath(p))
			want, _ := offsetCopy(h0, oh)
			pair := make([]float32, d)
			if d > 0 {
				kernels.Sum2(pair, a, x, b, y)
				kernels.AddRows(want, d, 1, pair)
			}
			h, bh := offsetCopy(h0, oh)
			so := int(seed % 16)
			scratch, bs := offsetCopy(make([]float32, d+kernels.ScratchPad), so)
			if d == 0 {
				require.Panics(t, func() { kernels.SumAddRows(h, d, a, x, b, y, scratch) }, "d = 0 has no rows")
			} else {
				kernels.SumAddRows(h, d, a, x, b, y, scratch)
			}
			requireGuards(t, bh, oh, len(h0))
			requireGuards(t, bs, so, len(scratch))
			require.Equal(t, bits(want), bits(h), "%s d=%d rows=%d: SumAddRows is not Sum2 then AddRows", p, d, nr)
		}
	})
}

// TestSumAddRowsShapes: the shape checks of AddRows, y's length and the scratch's, refused
// before h or the scratch changes.
func TestSumAddRowsShapes(t *testing.T) {
	envPath(t) // the test cache keys on the path chosen at init (env_test.go)
	h, scratch := make([]float32, 12), make([]float32, 4+kernels.ScratchPad)
	x, y := []float32{1, 2, 3, 4}, []float32{1, 2, 3, 4}
	for _, c := range []struct {
		h, scratch, x, y []float32
		d                int
	}{{h, scratch, x, y[:3], 4}, {h, scratch, x[:3], y, 4}, {h, scratch[:4+kernels.ScratchPad-1], x, y, 4}, {h[:10], scratch, x, y, 4}, {h, scratch, x, y, 0}} {
		require.Panics(t, func() { kernels.SumAddRows(c.h, c.d, 1, c.x, 1, c.y, c.scratch) })
	}
	require.Equal(t, make([]float32, 12), h)
	require.Equal(t, make([]float32, 4+kernels.ScratchPad), scratch)
	kernels.SumAddRows(h, 4, 2, x, 1, y, scratch)
	require.Equal(t, []float32{3, 6, 9, 12, 3, 6, 9, 12, 3, 6, 9, 12}, h)
}
