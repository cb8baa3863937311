//go:build amd64 && !purego

package kernels

// sumAddRowAVX2 writes dst = a*x + b*y and adds it to h in one pass (addrowssum_amd64.s);
// all four have the same length, at least 1.
//
//go:noescape
func sumAddRowAVX2(h, dst, x, y []float32, a, b float32)

// sumAddRowAVX512 is sumAddRowAVX2 with 512-bit vectors, for the avx512 path.
//
//go:noescape
func sumAddRowAVX512(h, dst, x, y []float32, a, b float32)

func sumAddRowImpl(h, dst, x, y []float32, a, b float32) {
	// Every SIMD path writes the sum AddRows2 adds (a product, then one fused multiply-add,
	// lane by lane). The avx512split path (Zen 4, which splits 512-bit operations in two) runs
	// the 256-bit kernel, as its add kernel keeps to 256-bit vectors in a single row.
	switch cur.id {
	case idGeneric:
		sum2Generic(dst, x, y, a, b)
		addRowsGeneric(h, dst, 1)
	case idAVX512:
		sumAddRowAVX512(h, dst, x, y, a, b)
	default:
		sumAddRowAVX2(h, dst, x, y, a, b)
	}
}
