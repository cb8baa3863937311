package kernels

import "math"

// Dot exposes the projection kernel Clamp uses, for the tests' accuracy checks.
func Dot(a, b []float32) float32 {
	if len(a) != len(b) {
		panic(msgLen)
	}
	return dotImpl(a, b)
}

// Sum2 writes dst = a*x + b*y as AddRows2 forms the sum it adds, the reference the tests
// hold SumAddRows to: AddRows2 onto a row of -0, which adds the rounded sum exactly
// (-0 + s is s for every s, ±0 included). It panics unless len(x) == len(y) == len(dst).
func Sum2(dst []float32, a float32, x []float32, b float32, y []float32) {
	if len(x) != len(dst) || len(y) != len(dst) {
		panic(msgLen)
	}
	if len(dst) == 0 {
		return
	}
	negZero := math.Float32frombits(1 << 31)
	for i := range dst {
		dst[i] = negZero
	}
	AddRows2(dst, len(dst), a, x, b, y)
}

// Axpy2 is AddRows2 on one row, dst[i] += a*x[i] + b*y[i], with the length checks of a vector
// kernel. It panics unless len(x) == len(y) == len(dst).
func Axpy2(dst []float32, a float32, x []float32, b float32, y []float32) {
	if len(x) != len(dst) || len(y) != len(dst) {
		panic(msgLen)
	}
	if len(dst) == 0 {
		return
	}
	AddRows2(dst, len(dst), a, x, b, y)
}

// Panic messages, for the tests that check which check fired.
const (
	MsgShape = msgShape
	MsgDim   = msgDim
)

// WithTuning runs f with the path in use tuned as given (impl.blocksFrom, impl.ymmFrom,
// impl.pairs: the avx512 path's choice of body; other paths ignore them), then restores it.
func WithTuning(blocksFrom, ymmFrom int, pairs bool, f func()) {
	old := cur
	defer func() { cur = old }()
	cur.blocksFrom, cur.ymmFrom, cur.pairs = blocksFrom, ymmFrom, pairs
	f()
}
