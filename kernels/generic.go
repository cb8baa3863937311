package kernels

// genericImpl is the pure-Go path. It is compiled on every platform so it
// can be tested (and forced) everywhere.
var genericImpl = impl{name: PathGeneric, id: idGeneric}

func addRowsGeneric(h, v []float32, s float32) {
	d := len(v)
	for len(h) >= d {
		row := h[:d] // lets the compiler drop bounds checks in the loop
		for i, x := range v {
			row[i] += s * x
		}
		h = h[d:]
	}
}

// addRows2Generic adds to each element the sum a*x + b*y, computed as sum2Generic computes
// it (the same expression, so whatever the compiler fuses it fuses in both).
func addRows2Generic(h, x, y []float32, a, b float32) {
	d := len(x)
	y = y[:d]
	for len(h) >= d {
		row := h[:d]
		for i, xv := range x {
			t := a * xv
			t = t + b*y[i]
			row[i] = row[i] + t
		}
		h = h[d:]
	}
}

func sum2Generic(dst, x, y []float32, a, b float32) {
	dst = dst[:len(x)]
	y = y[:len(x)]
	for i, xv := range x {
		t := a * xv
		dst[i] = t + b*y[i]
	}
}

func dotGeneric(a, b []float32) float32 {
	b = b[:len(a)]
	// Four partial sums break the add dependency chain (~4x faster than one
	// accumulator) at no cost in the error bound.
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

func sumSqGeneric(a []float32) float64 {
	var s float64
	for _, x := range a {
		f := float64(x)
		s += f * f
	}
	return s
}
