package kernels

// SumAddRows adds a*x[i] + b*y[i] to element i of every row of h (rows of d = len(x) floats):
// bit for bit the sum a*x + b*y as AddRows2 forms it, written to a scratch row, followed by
// AddRows(h, d, 1, scratch) on the same path, with the sum formed in the pass over h's first
// row (one pass reading x, y and that row) and the scratch row placed where it does not alias
// h, x or y modulo 4 KiB (see apart). For a span of rows that gets the same two vectors (a
// prefill request's own and the global one). scratch must hold at least d+ScratchPad floats
// and must not overlap h, x or y; its contents are overwritten. It panics like AddRows, and
// unless len(y) == d and scratch is long enough, before anything is written.
func SumAddRows(h []float32, d int, a float32, x []float32, b float32, y []float32, scratch []float32) {
	rows := checkRows(h, d, x)
	if len(y) != d || len(scratch) < d+ScratchPad {
		panic(msgShape)
	}
	if rows == 0 {
		return
	}
	dst := apart(scratch, d, h, x, y)
	sumAddRowImpl(h[:d], dst, x, y, a, b)
	if rows > 1 {
		addRowsImpl(h[d:], dst, 1)
	}
}
