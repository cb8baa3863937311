//go:build !amd64 || purego

package kernels

func sumAddRowImpl(h, dst, x, y []float32, a, b float32) {
	sum2Generic(dst, x, y, a, b)
	addRowsGeneric(h, dst, 1)
}
