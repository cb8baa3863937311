package kernels_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/kernels"
)

// FuzzAddRows compares the one-source add (AddRows, and Axpy for one row) on every path with
// the generic path and with the exact result, for row lengths 0–4096, 0–9 rows (the SIMD
// paths' blocks of four rows alone, with one to three rows after them, and single rows) and
// independent unaligned starts of h and v, guards either side of h checked; the SIMD paths
// (both fused, one rounding) agree bit for bit, each path also under each tuning of its body
// (kernels.WithTuning).
func FuzzAddRows(f *testing.F) {
	envPath(f) // the test cache keys on the path chosen at init (env_test.go)
	f.Add(uint16(4096), uint8(1), uint8(0), uint8(0), float32(0.5), uint64(1))
	f.Add(uint16(4095), uint8(3), uint8(1), uint8(15), float32(-0.37), uint64(2))
	f.Add(uint16(63), uint8(4), uint8(7), uint8(3), float32(1), uint64(3))
	f.Add(uint16(0), uint8(2), uint8(0), uint8(0), float32(2), uint64(4))
	f.Add(uint16(4096), uint8(7), uint8(0), uint8(0), float32(0.5), uint64(5))
	f.Add(uint16(47), uint8(9), uint8(5), uint8(9), float32(-3), uint64(6))
	f.Fuzz(func(t *testing.T, n uint16, rows, offH, offV uint8, s float32, seed uint64) {
		d := int(n) % 4097
		nr := int(rows) % 10
		if !finite32(s) || math.Abs(float64(s)) > 1e4 {
			return // keeps s·v (|v| ≤ 1.5e30) inside float32: overflow is TestSpecialValues'
		}
		r := rand.New(rand.NewPCG(seed, uint64(d)))
		h0, v0 := randVals(r, nr*d, 1e30), randVals(r, d, 1e30)
		oh, ov := int(offH%16), int(offV%16)
		orig := kernels.Path()
		t.Cleanup(func() { require.NoError(t, kernels.SetPath(orig)) })
		v, _ := offsetCopy(v0, ov)
		add := func() []float32 {
			h, bh := offsetCopy(h0, oh)
			if d == 0 {
				kernels.Axpy(h, s, v) // empty: nothing to add, no row length
			} else {
				kernels.AddRows(h, d, s, v)
			}
			requireGuards(t, bh, oh, len(h0))
			return h
		}
		run := func(p string) []float32 {
			require.NoError(t, kernels.SetPath(p))
			return add()
		}
		generic := run(kernels.PathGeneric)
		checkUpdate(t, generic, h0, s, func(i int) float32 { return v0[i%d] })
		var simd []float32
		for _, p := range kernels.Paths() {
			if p == kernels.PathGeneric {
				continue
			}
			h := run(p)
			checkUpdate(t, h, h0, s, func(i int) float32 { return v0[i%d] })
			for i := range h {
				if tol := 2 * axpyTol(float64(h0[i]), float64(s), float64(v0[i%d])); math.Abs(float64(h[i])-float64(generic[i])) > tol {
					require.Failf(t, "path differs from generic", "%s d=%d i=%d got=%g generic=%g", p, d, i, h[i], generic[i])
				}
			}
			if simd != nil {
				require.Equal(t, bits(simd), bits(h), "%s d=%d rows=%d: SIMD paths differ", p, d, nr)
			}
			simd = h
			if d > 0 {
				// The same path with each tuning (the avx512 path's four bodies; the others
				// ignore it).
				for _, tu := range []struct {
					blocksFrom, ymmFrom int
					pairs               bool
				}{{0, math.MaxInt, false}, {math.MaxInt, 0, false}, {math.MaxInt, math.MaxInt, false}, {math.MaxInt, math.MaxInt, true}} {
					var alt []float32
					kernels.WithTuning(tu.blocksFrom, tu.ymmFrom, tu.pairs, func() { alt = add() })
					require.Equal(t, bits(h), bits(alt), "%s d=%d rows=%d tuning %+v: bodies differ", p, d, nr, tu)
				}
			}
			if nr == 1 {
				a, ba := offsetCopy(h0, oh)
				kernels.Axpy(a, s, v)
				requireGuards(t, ba, oh, len(h0))
				require.Equal(t, bits(h), bits(a), "%s d=%d: Axpy is not AddRows of one row", p, d)
			}
		}
	})
}
