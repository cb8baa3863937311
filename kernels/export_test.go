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

// WithTuning runs f with the path in use tuned as given (impl.blocksFrom, impl.ymmFrom,
// impl.pairs: the avx512 path's choice of body; other paths ignore them), then restores it.
func WithTuning(blocksFrom, ymmFrom int, pairs bool, f func()) {
	old := cur
	defer func() { cur = old }()
	cur.blocksFrom, cur.ymmFrom, cur.pairs = blocksFrom, ymmFrom, pairs
	f()
}
