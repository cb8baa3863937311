// Package ccompare benchmarks the kernels package against the same row add
// written as a plain C loop compiled by the system C compiler with
// -O3 -march=native in four variants (with 512-bit vectors preferred, and
// with D a compile-time constant: see Variants), racing the fastest, and
// against a plain Go loop. It exists only to measure (bench calls
// AddRowsVariantRepeat, and `go test -bench Compare ./internal/ccompare` runs
// the comparison alone, through Run); nothing in the steering path may import
// it, and it must not hold anything the kernels need.
//
// It needs cgo. Without cgo (CGO_ENABLED=0 or no C compiler) the package
// still builds: Available reports false, Run returns ErrUnavailable and
// AddRows panics.
package ccompare

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/shmsteer/shmsteer/kernels"
)

// ErrUnavailable is returned by Run when the C implementation was not built
// (no cgo).
var ErrUnavailable = errors.New("shmsteer: C comparison kernels unavailable (built without cgo)")

// ErrVariant reports an unknown variant name, or a compile-time-D variant asked for another
// row length: pick one of Variants, and a "-d4096" one only for d = 4096.
var ErrVariant = errors.New("shmsteer: no such C variant for this shape")

// Variants are the gcc builds of the C loop, in the order the bench races them: "native" is
// -O3 -march=native; "native512" adds prefer-vector-width=512 (a function attribute, as
// -mprefer-vector-width=512 would); the "-d4096" ones have the row length a compile-time
// constant and only take d = 4096.
var Variants = []string{"native", "native512", "native-d4096", "native512-d4096"}

// ConstD is the row length the "-d4096" variants are compiled for.
const ConstD = 4096

// AddRowsVariantRepeat runs variant (one of Variants) iters times over h inside one cgo call,
// like AddRowsRepeat. ErrVariant for an unknown name or a "-d4096" variant with d != ConstD;
// ErrUnavailable without cgo.
func AddRowsVariantRepeat(variant string, h []float32, d int, s float32, v []float32, iters int) error {
	if !cAvailable {
		return ErrUnavailable
	}
	i := slices.Index(Variants, variant)
	if i < 0 || (strings.HasSuffix(variant, "-d4096") && d != ConstD) {
		return fmt.Errorf("%w: %q with d = %d", ErrVariant, variant, d)
	}
	checkShape(h, d, v)
	cAddRowsRepeat(i, h, d, s, v, iters)
	return nil
}

// Available reports whether the C implementation was compiled in.
func Available() bool { return cAvailable }

// AddRows is h[t] += s*v for each row of the T×d matrix h, computed by the
// C loop (one cgo call). Same shape rules as kernels.AddRows; panics if the C
// implementation is unavailable.
func AddRows(h []float32, d int, s float32, v []float32) {
	if !cAvailable {
		panic(ErrUnavailable)
	}
	checkShape(h, d, v)
	cAddRowsRepeat(0, h, d, s, v, 1)
}

// AddRowsRepeat runs the C add iters times over h inside one cgo call, so the ~50 ns cgo
// transition is paid once, not per add: the fair way to time C against a Go loop of iters
// calls. Same shape rules as AddRows; ErrUnavailable without cgo.
func AddRowsRepeat(h []float32, d int, s float32, v []float32, iters int) error {
	if !cAvailable {
		return ErrUnavailable
	}
	checkShape(h, d, v)
	cAddRowsRepeat(0, h, d, s, v, iters)
	return nil
}

func checkShape(h []float32, d int, v []float32) {
	if d <= 0 || len(v) != d || len(h)%d != 0 {
		panic("ccompare: bad shape")
	}
}

// Size is one benchmark shape: h is T×D float32.
type Size struct {
	Name string
	T, D int
}

// DefaultSizes are the four shapes at D = 4096: h of 16 KiB,
// 256 KiB, 4 MiB and 64 MiB.
var DefaultSizes = []Size{
	{"16k", 1, 4096},
	{"256k", 16, 4096},
	{"4m", 256, 4096},
	{"64m", 4096, 4096},
}

// Result holds median nanoseconds per AddRows call over all rounds.
type Result struct {
	Size     string
	T, D     int
	Path     string // kernels path measured as "ours"
	OursNs   float64
	CNs      float64 // the fastest gcc variant each round
	GoLoopNs float64
	// CVariant is the variant (of Variants) with the lowest median.
	CVariant string
	// PairedRatio is the median over rounds of (C time / our time) within
	// the same round. Adjacent measurements share the machine's load at
	// that moment, so this is steadier than CNs/OursNs on a busy machine.
	PairedRatio float64
}

// Ratio is C time / our time: ≥ 1 means ours is at least as fast as C.
func (r Result) Ratio() float64 { return r.CNs / r.OursNs }

// VsGoLoop is plain-Go-loop time / our time.
func (r Result) VsGoLoop() float64 { return r.GoLoopNs / r.OursNs }

// Run measures DefaultSizes; see RunSizes.
func Run(rounds int, minDur time.Duration) ([]Result, error) {
	return RunSizes(rounds, minDur, DefaultSizes)
}

// RunSizes measures, for each size, the current kernels path ("ours"), the C
// loop (every variant of Variants that takes the size; C's time in a round is
// its fastest variant's) and a plain Go loop, interleaved A B C A B C … for rounds rounds on
// the same (warmed) buffers. Each round times enough back-to-back calls to
// last at least minDur; C repeats its loop inside one cgo call so the ~50 ns
// cgo transition is amortized, and ours runs the same iteration count in a Go
// loop. Medians are reported because the machine is shared and noisy.
func RunSizes(rounds int, minDur time.Duration, sizes []Size) ([]Result, error) {
	if !cAvailable {
		return nil, ErrUnavailable
	}
	if rounds < 1 {
		rounds = 1
	}
	out := make([]Result, 0, len(sizes))
	for _, sz := range sizes {
		h := make([]float32, sz.T*sz.D)
		v := make([]float32, sz.D)
		for i := range h {
			h[i] = float32(i%97) * 0.01
		}
		for i := range v {
			v[i] = float32(i%89) * 0.01
		}
		// Alternating the sign of s keeps h bounded however long we run.
		s := float32(1e-3)
		ours := func(n int) {
			for range n {
				kernels.AddRows(h, sz.D, s, v)
			}
			s = -s
		}
		var cs []func(int)
		var names []string
		for i, name := range Variants {
			if strings.HasSuffix(name, "-d4096") && sz.D != ConstD {
				continue
			}
			cs = append(cs, func(n int) {
				cAddRowsRepeat(i, h, sz.D, s, v, n)
				s = -s
			})
			names = append(names, name)
		}
		perVariant := make([][]float64, len(cs))
		c := func(n int) float64 {
			best := 0.0
			for i, f := range cs {
				t := timeIt(f, n)
				perVariant[i] = append(perVariant[i], t)
				if i == 0 || t < best {
					best = t
				}
			}
			return best
		}
		gol := func(n int) {
			for range n {
				goLoopAddRows(h, sz.D, s, v)
			}
			s = -s
		}
		// Same iteration count for ours and C, as the issue asks; the Go
		// loop (10-20x slower) gets its own so a round stays short.
		n := calibrate(ours, minDur)
		for _, f := range cs {
			n = max(n, calibrate(f, minDur))
		}
		ng := calibrate(gol, minDur)
		var to, tc, tg, pr []float64
		for i := range rounds {
			// Swap the order every round so neither side always runs
			// right after the (cache-polluting, slower) Go loop.
			var o, cc float64
			if i%2 == 0 {
				o, cc = timeIt(ours, n), c(n)
			} else {
				cc, o = c(n), timeIt(ours, n)
			}
			to, tc, pr = append(to, o), append(tc, cc), append(pr, cc/o)
			tg = append(tg, timeIt(gol, ng))
		}
		bestV := 0
		for i := range perVariant {
			if median(perVariant[i]) < median(perVariant[bestV]) {
				bestV = i
			}
		}
		out = append(out, Result{
			Size: sz.Name, T: sz.T, D: sz.D, Path: kernels.Path(),
			OursNs: median(to), CNs: median(tc), GoLoopNs: median(tg),
			CVariant: names[bestV], PairedRatio: median(pr),
		})
	}
	return out, nil
}

// calibrate returns an iteration count whose run lasts at least minDur
// (which also warms caches and the buffers' pages).
func calibrate(f func(int), minDur time.Duration) int {
	n := 1
	for {
		start := time.Now()
		f(n)
		el := time.Since(start)
		if el >= minDur {
			return n
		}
		if el <= 0 {
			n *= 100
			continue
		}
		// Aim 20% past minDur, growing at most 100x per step.
		next := int(float64(n) * 1.2 * float64(minDur) / float64(el))
		n = min(max(next, n+1), 100*n)
	}
}

func timeIt(f func(int), n int) float64 {
	start := time.Now()
	f(n)
	return float64(time.Since(start).Nanoseconds()) / float64(n)
}

func median(x []float64) float64 {
	x = slices.Clone(x)
	slices.Sort(x)
	if len(x)%2 == 1 {
		return x[len(x)/2]
	}
	return (x[len(x)/2-1] + x[len(x)/2]) / 2
}

// goLoopAddRows is the plain Go loop baseline.
func goLoopAddRows(h []float32, d int, s float32, v []float32) {
	for t := 0; t+d <= len(h); t += d {
		row := h[t : t+d]
		for i := range row {
			row[i] += s * v[i]
		}
	}
}

// Format renders results as a fixed-width table.
func Format(rs []Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-6s %5s %5s %-7s %12s %12s %-16s %12s %8s %8s %8s\n",
		"size", "T", "D", "path", "ours ns/op", "C ns/op", "best C variant", "goloop ns/op", "C/ours", "paired", "go/ours")
	for _, r := range rs {
		fmt.Fprintf(&b, "%-6s %5d %5d %-7s %12.1f %12.1f %-16s %12.1f %8.3f %8.3f %8.2f\n",
			r.Size, r.T, r.D, r.Path, r.OursNs, r.CNs, r.CVariant, r.GoLoopNs, r.Ratio(), r.PairedRatio, r.VsGoLoop())
	}
	return b.String()
}
