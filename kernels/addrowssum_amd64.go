//go:build amd64 && !purego

package kernels

// sumAddRowAVX2 writes dst = a*x + b*y and adds it to h in one pass (addrowssum_amd64.s);
// all four have the same length, at least 1.
//
//go:noescape
func sumAddRowAVX2(h, dst, x, y []float32, a, b float32)

func sumAddRowImpl(h, dst, x, y []float32, a, b float32) {
	// The AVX-512 paths run the 256-bit kernel too: the sum it writes is the one sum2AVX512
	// writes (a product, then one fused multiply-add, lane by lane). It was written on a CPU
	// that splits 512-bit operations in two (Zen 4, the avx512split path's); a 512-bit version
	// for full-width CPUs has not been measured.
	if cur.id == idGeneric {
		sum2Generic(dst, x, y, a, b)
		addRowsGeneric(h, dst, 1)
		return
	}
	sumAddRowAVX2(h, dst, x, y, a, b)
}
