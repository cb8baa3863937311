package bench

import (
	"math/rand/v2"
)

// kernelD is the hidden size of the add benchmark (a 7B-class model).
const kernelD = 4096

// kernelSize is one h shape of the add benchmark: T rows of kernelD float32,
// tagged by the size of h in bytes.
type kernelSize struct {
	Tag string
	T   int
}

// kernelSizes are the T values measured: one decode token, a small batch, a
// prefill chunk, a long prefill and a 1 GiB block far past any cache (16 KiB
// to 1 GiB of h). Tags appear in figure names, e.g. kernels.add.4m.numpy_ns.
//
// Working sets: the Go and C contenders of a size share one h of that size and
// one v (16 KiB) and add into that h every call, so a call touches len(h)*4 +
// 16 KiB bytes (the figure's working_set_bytes). 16k and 256k stay in L2, 4m
// in L3 (when the machine's other work leaves it alone); 1g streams from DRAM
// on every call, and 64m does too but where the L3 holds it (a Xeon with
// 260 MiB of L3: whether it stays there between calls depends on what ran
// before, hence numpy's group of its own, see runFigures). Calls never overlap, so sharing changes no
// contender's work; it puts every contender on the same pages (a buffer of its
// own per contender made the DRAM-bound figures partly a comparison of page
// placements) and keeps the 1 GiB run's footprint at 2 GiB plus numpy's own
// 1 GiB. numpy, in its own process, has its own buffers.
var kernelSizes = []kernelSize{{"16k", 1}, {"256k", 16}, {"4m", 256}, {"64m", 4096}, hugeKernelSize}

// hugeKernelSize is the 1 GiB case: skipped in --quick (reported as such), and
// the one kernels.add.1g.bw_fraction is measured on.
var hugeKernelSize = kernelSize{"1g", 1 << 30 / (4 * kernelD)}

// sharedNumpySizes are the sizes one numpy process holds for the whole run;
// the 1 GiB case gets its own process, alive only while its group runs.
func sharedNumpySizes() []kernelSize { return kernelSizes[:len(kernelSizes)-1] }

// workingSet is the bytes one add call of size k touches: h and v.
func (k kernelSize) workingSet() int64 { return int64(k.T+1) * kernelD * 4 }

// addFunc adds s*v to each of the len(h)/d rows of h, in place; it is the
// signature of kernels.AddRows.
type addFunc func(h []float32, d int, s float32, v []float32)

// addRepeatFunc runs an addFunc iters times over the same h and v.
type addRepeatFunc func(h []float32, d int, s float32, v []float32, iters int)

// kernelScale is s in h += s*v. Small enough that h stays far from float32
// overflow however many rounds run.
const kernelScale = 0.5

// kernelData returns an h of t rows, every page touched so the first round
// does not pay for page faults, and a v with values in [-1, 1).
func kernelData(t int) (h, v []float32) {
	r := rand.New(rand.NewPCG(6, 6))
	h = make([]float32, t*kernelD)
	for i := range h {
		h[i] = 0.25
	}
	v = make([]float32, kernelD)
	for i := range v {
		v[i] = 2*r.Float32() - 1
	}
	return h, v
}

// goLoopAdd is the loop a Go programmer writes: each row re-sliced, then a
// range loop over v with the row re-sliced to the same length, the form the
// compiler's bounds-check elimination recognizes. Go does not vectorize it: it
// is scalar SSE, which is the point of the figure. (Issue 13: the earlier
// h[t*d+i] form kept its bounds checks and ran 2.1-2.6x slower.)
func goLoopAdd(h []float32, d int, s float32, v []float32) {
	for len(h) >= d {
		row, vr := h[:d], v[:d]
		for i, x := range vr {
			row[i] += s * x
		}
		h = h[d:]
	}
}

// kernelBuffers hands the contenders of one size their h and v: one pair,
// allocated on first use and shared (see kernelSizes).
type kernelBuffers struct {
	k    kernelSize
	h, v []float32
}

func (b *kernelBuffers) get() (h, v []float32) {
	if b.h == nil {
		b.h, b.v = kernelData(b.k.T)
	}
	return b.h, b.v
}

// copySetup is a copy bandwidth reference of the 1g case: Go's copy() of the
// shared 1 GiB h into a second 1 GiB buffer, which like the add reads 1 GiB and
// writes 1 GiB per call; in one call (chunk 0: for sizes this large Go's
// memmove uses non-temporal stores) or in chunks of chunk floats (regular
// stores, each chunk well inside the cache). The bench takes the faster.
func copySetup(b *kernelBuffers, dst *[]float32, chunk int) setupFunc {
	return func() (Op, func() error, error) {
		src, _ := b.get()
		if *dst == nil {
			*dst = make([]float32, len(src))
		}
		d := *dst
		cp := func() {
			if chunk == 0 {
				copy(d, src)
				return
			}
			for off := 0; off < len(src); off += chunk {
				copy(d[off:min(off+chunk, len(d))], src[off:])
			}
		}
		cp() // fault the destination's pages in before timing
		return cpuOp(func(n int) error {
			for range n {
				cp()
			}
			return nil
		}), nil, nil
	}
}

// repeated is fn as an addRepeatFunc: fn called iters times from a Go loop, through the func
// value (the Go loop contender's way).
func repeated(fn addFunc) addRepeatFunc {
	return func(h []float32, d int, s float32, v []float32, iters int) {
		for range iters {
			fn(h, d, s, v)
		}
	}
}

// addSetup measures fn, which runs an add n times in a loop of its own, on the shared buffers
// of size k. h escapes into the closure and is written in place, so the adds cannot be elided.
func addSetup(b *kernelBuffers, fn addRepeatFunc) setupFunc {
	return func() (Op, func() error, error) {
		if fn == nil {
			return nil, nil, ErrNotWired
		}
		h, v := b.get()
		return cpuOp(func(n int) error {
			fn(h, kernelD, kernelScale, v, n)
			return nil
		}), nil, nil
	}
}

// addRepeatSetup measures a kernel that repeats the add itself (a C variant, one cgo call per
// batch), on its own buffers of size k, like addSetup.
func addRepeatSetup(b *kernelBuffers, variant string, fn func(variant string, h []float32, d int, s float32, v []float32, iters int) error) setupFunc {
	return func() (Op, func() error, error) {
		if fn == nil {
			return nil, nil, ErrNotWired
		}
		h, v := b.get()
		if err := fn(variant, h, kernelD, kernelScale, v, 1); err != nil {
			return nil, nil, err
		}
		return cpuOp(func(n int) error { return fn(variant, h, kernelD, kernelScale, v, n) }), nil, nil
	}
}
