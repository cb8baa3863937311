//go:build !amd64 || purego

package kernels

// archImpls reports no SIMD paths: this build has no assembly kernels.
func archImpls() []impl { return nil }

func addRowsImpl(h, v []float32, s float32) { addRowsGeneric(h, v, s) }

// addRowsEntry is AddRows: here all of it is Go.
func addRowsEntry(h []float32, d int, s float32, v []float32) { addRowsSlow(h, d, s, v) }

func dotImpl(a, b []float32) float32 { return dotGeneric(a, b) }

func sumSqImpl(a []float32) float64 { return sumSqGeneric(a) }

// addRowsSIMD is never reached here (no SIMD path is supported); it runs the generic path.
func addRowsSIMD(h, v []float32, s float32, path int) { addRowsGeneric(h, v, s) }

func addRows2SIMD(h, x, y []float32, a, b float32, path int) bool { return false }
