package bench

import (
	"math/rand/v2"
	"time"
)

// KernelD is the hidden size of the add benchmark (a 7B-class model).
const KernelD = 4096

// KernelSize is one h shape of the add benchmark: T rows of KernelD float32,
// tagged by the size of h in bytes.
type KernelSize struct {
	Tag string
	T   int
}

// KernelSizes are the T values measured: one decode token, a small batch, a
// prefill chunk and a long prefill (16 KiB to 64 MiB of h). Tags appear in
// figure names, e.g. kernels.add.4m.numpy_ns.
var KernelSizes = []KernelSize{{"16k", 1}, {"256k", 16}, {"4m", 256}, {"64m", 4096}}

// AddFunc adds s*v to each of the len(h)/d rows of h, in place; it is the
// signature of kernels.AddRows.
type AddFunc func(h []float32, d int, s float32, v []float32)

// kernelScale is s in h += s*v. Small enough that h stays far from float32
// overflow however many rounds run.
const kernelScale = 0.5

// kernelData returns an h of t rows, every page touched so the first round
// does not pay for page faults, and a v with values in [-1, 1).
func kernelData(t int) (h, v []float32) {
	r := rand.New(rand.NewPCG(6, 6))
	h = make([]float32, t*KernelD)
	for i := range h {
		h[i] = 0.25
	}
	v = make([]float32, KernelD)
	for i := range v {
		v[i] = 2*r.Float32() - 1
	}
	return h, v
}

// goLoopAdd is what a Go programmer writes first: two plain loops. The
// compiler keeps the bounds checks and emits scalar SSE, which is the
// point of the figure.
func goLoopAdd(h []float32, d int, s float32, v []float32) {
	for t := 0; t < len(h)/d; t++ {
		for i := 0; i < d; i++ {
			h[t*d+i] += s * v[i]
		}
	}
}

// addSetup measures fn on its own buffers of size k. h escapes into the
// closure and is written in place, so the adds cannot be elided.
func addSetup(k KernelSize, fn AddFunc) Setup {
	return func() (Op, func() error, error) {
		if fn == nil {
			return nil, nil, ErrNotWired
		}
		h, v := kernelData(k.T)
		return func(n int) (time.Duration, error) {
			start := time.Now()
			for range n {
				fn(h, KernelD, kernelScale, v)
			}
			return time.Since(start), nil
		}, nil, nil
	}
}

// addRepeatSetup measures a kernel that repeats the add itself (the C loop, one cgo call per
// batch), on its own buffers of size k, like addSetup.
func addRepeatSetup(k KernelSize, fn func(h []float32, d int, s float32, v []float32, iters int) error) Setup {
	return func() (Op, func() error, error) {
		if fn == nil {
			return nil, nil, ErrNotWired
		}
		h, v := kernelData(k.T)
		if err := fn(h, KernelD, kernelScale, v, 1); err != nil {
			return nil, nil, err
		}
		return func(n int) (time.Duration, error) {
			start := time.Now()
			err := fn(h, KernelD, kernelScale, v, n)
			return time.Since(start), err
		}, nil, nil
	}
}
