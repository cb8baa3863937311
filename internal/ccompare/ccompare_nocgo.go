//go:build !cgo

package ccompare

const cAvailable = false

func cAddRowsRepeat(variant int, h []float32, d int, s float32, v []float32, iters int) {
	panic(ErrUnavailable)
}
