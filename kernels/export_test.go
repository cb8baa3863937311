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
