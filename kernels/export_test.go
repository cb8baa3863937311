package kernels

// Dot exposes the projection kernel Clamp uses, for the tests' accuracy checks.
func Dot(a, b []float32) float32 {
	if len(a) != len(b) {
		panic(msgLen)
	}
	return dotImpl(a, b)
}

// Panic messages, for the tests that check which check fired.
const (
	MsgShape = msgShape
	MsgDim   = msgDim
)

// WithBlocksFrom runs f with the path in use adding in blocks of four rows from n floats of h
// (impl.blocksFrom: the avx512 path's choice between its two bodies), then restores it.
func WithBlocksFrom(n int, f func()) {
	old := cur.blocksFrom
	defer func() { cur.blocksFrom = old }()
	cur.blocksFrom = n
	f()
}
