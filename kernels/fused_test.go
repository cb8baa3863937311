package kernels_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/kernels"
)

// The two-source kernels (AddRows2 and SumAddRows; Axpy2 and Sum2 are AddRows2's test forms,
// export_test.go) against exact float32 references (unit coefficients), against Sum2 followed
// by a one-source pass (any coefficients) and against the generic path.
//
// Element update r = h + (a·x + b·y) with exact value e and S = |h|+|a·x|+|b·y|: the SIMD paths
// round three times (a product, an FMA, a sum), an unfused generic build four times, each
// rounding at most u times an intermediate ≤ S(1+u)^k, so |r - e| ≤ 4.001·u·S + 4·eta covers
// every path (eta: the subnormal range, as axpyTol).

func fusedTol(h, a, x, b, y float64) float64 {
	return 4.001*u*(math.Abs(h)+math.Abs(a*x)+math.Abs(b*y)) + 4*eta
}

// checkFused asserts got ≈ (h0 + a·x + b·y) elementwise, x and y indexed by xv, yv.
func checkFused(t *testing.T, got, h0 []float32, a float32, xv func(int) float32, b float32, yv func(int) float32) {
	t.Helper()
	for i := range got {
		h, x, y := float64(h0[i]), float64(xv(i)), float64(yv(i))
		want := h + float64(a)*x + float64(b)*y
		if tol := fusedTol(h, float64(a), x, float64(b), y); math.Abs(float64(got[i])-want) > tol {
			require.Failf(t, "mismatch", "i=%d h=%g a=%g x=%g b=%g y=%g got=%g want=%g tol=%g",
				i, h0[i], a, xv(i), b, yv(i), got[i], want, tol)
		}
	}
}

// viaSum2 is the two-step form of the fused add on the current path: Sum2 of the sources into
// a scratch row, then AddRows with it at scale 1 (what the Stepper does for long spans).
func viaSum2(h []float32, d int, a float32, x []float32, b float32, y []float32) []float32 {
	out := append([]float32(nil), h...)
	if d == 0 {
		return out
	}
	tmp := make([]float32, d)
	kernels.Sum2(tmp, a, x, b, y)
	kernels.AddRows(out, d, 1, tmp)
	return out
}

// unitRef is h + (x + y) in float32 (no products, so no compiler may fuse anything): the
// exact result of the fused add with a = b = 1 on every path.
func unitRef(h []float32, d int, x, y []float32) []float32 {
	out := make([]float32, len(h))
	for i := range h {
		out[i] = h[i] + (x[i%d] + y[i%d])
	}
	return out
}

func TestAddRows2(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(21, 22))
		var ds []int
		for d := 1; d <= 130; d++ {
			ds = append(ds, d)
		}
		ds = append(ds, dims...)
		for _, d := range ds {
			for _, rows := range []int{0, 1, 3} {
				offH, offX, offY := r.IntN(16), r.IntN(16), r.IntN(16)
				a, b := scales[r.IntN(len(scales))], scales[r.IntN(len(scales))]
				h0 := randVals(r, rows*d, 1e30)
				x0, y0 := randVals(r, d, 1e30), randVals(r, d, 1e30)
				h, bh := offsetCopy(h0, offH)
				x, _ := offsetCopy(x0, offX)
				y, _ := offsetCopy(y0, offY)
				want := viaSum2(h, d, a, x, b, y)
				unit := h
				if rows > 0 {
					unit = append([]float32(nil), h...)
					kernels.AddRows2(unit, d, 1, x, 1, y)
					require.Equal(t, bits(unitRef(h0, d, x0, y0)), bits(unit), "d=%d rows=%d: a = b = 1 is not h + (x + y)", d, rows)
				}
				kernels.AddRows2(h, d, a, x, b, y)
				require.Equal(t, bits(want), bits(h), "d=%d rows=%d: not Sum2 then AddRows bit for bit", d, rows)
				checkFused(t, h, h0, a, func(i int) float32 { return x0[i%d] }, b, func(i int) float32 { return y0[i%d] })
				requireGuards(t, bh, offH, len(h0))
				require.Equal(t, x0, x, "x must not be modified")
				require.Equal(t, y0, y, "y must not be modified")
				if rows == 1 {
					h1, _ := offsetCopy(h0, offH)
					kernels.Axpy2(h1, a, x, b, y)
					require.Equal(t, bits(h), bits(h1), "Axpy2 is AddRows2 on one row")
				}
			}
		}
	})
}

// TestFusedEveryLength runs every length 0–4096, each at an unaligned start of each stream,
// on every path against the generic path.
func TestFusedEveryLength(t *testing.T) {
	envPath(t) // the test cache keys on the path chosen at init (env_test.go)
	r := rand.New(rand.NewPCG(23, 24))
	orig := kernels.Path()
	t.Cleanup(func() { require.NoError(t, kernels.SetPath(orig)) })
	for n := 0; n <= 4096; n++ {
		a, b := scales[r.IntN(len(scales))], scales[r.IntN(len(scales))]
		h0, x0, y0 := randVals(r, n, 1e30), randVals(r, n, 1e30), randVals(r, n, 1e30)
		compareFused(t, h0, x0, y0, a, b, n%16, (n/16)%16, (n*7)%16)
	}
}

// compareFused runs Axpy2 on every path from the given start offsets and checks each result
// against the generic path's (within fusedTol of the exact value for both), Sum2 then Axpy on
// its own path and, with unit coefficients, h + (x + y) (bit for bit), and the guards around h.
func compareFused(t *testing.T, h0, x0, y0 []float32, a, b float32, offH, offX, offY int) {
	t.Helper()
	n := len(h0)
	x, _ := offsetCopy(x0, offX)
	y, _ := offsetCopy(y0, offY)
	var generic []float32
	for _, p := range append([]string{kernels.PathGeneric}, kernels.Paths()...) {
		require.NoError(t, kernels.SetPath(p))
		h, bh := offsetCopy(h0, offH)
		want := viaSum2(h, n, a, x, b, y)
		if n > 0 {
			unit := append([]float32(nil), h...)
			kernels.Axpy2(unit, 1, x, 1, y)
			require.Equal(t, bits(unitRef(h0, n, x0, y0)), bits(unit), "%s n=%d: a = b = 1 is not h + (x + y)", p, n)
		}
		kernels.Axpy2(h, a, x, b, y)
		requireGuards(t, bh, offH, n)
		require.Equal(t, bits(want), bits(h), "%s n=%d: not Sum2 then Axpy bit for bit", p, n)
		if p == kernels.PathGeneric && generic == nil {
			generic = append([]float32{}, h...)
			checkFused(t, h, h0, a, func(i int) float32 { return x0[i] }, b, func(i int) float32 { return y0[i] })
			continue
		}
		for i := range h {
			tol := 2 * fusedTol(float64(h0[i]), float64(a), float64(x0[i]), float64(b), float64(y0[i]))
			if math.Abs(float64(h[i])-float64(generic[i])) > tol {
				require.Failf(t, "path differs from generic", "%s n=%d i=%d got=%g generic=%g tol=%g", p, n, i, h[i], generic[i], tol)
			}
		}
	}
}

func TestAddRows2SpecialValues(t *testing.T) {
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	forEachPath(t, func(t *testing.T) {
		for _, n := range []int{1, 5, 16, 37, 64, 100} {
			for pos := 0; pos < n; pos += 1 + n/7 {
				for _, c := range []struct {
					h, x, y, want float32
				}{{1, nan, 1, nan}, {1, 1, nan, nan}, {1, inf, 1, inf}, {1, inf, -inf, nan}, {inf, 1, 1, inf}} {
					h, x, y := make([]float32, n), make([]float32, n), make([]float32, n)
					for i := range h {
						h[i], x[i], y[i] = 1, 2, 3
					}
					h[pos], x[pos], y[pos] = c.h, c.x, c.y
					kernels.AddRows2(h, n, 1, x, 1, y)
					for i := range h {
						want := float32(6)
						if i == pos {
							want = c.want
						}
						if math.IsNaN(float64(want)) {
							require.True(t, math.IsNaN(float64(h[i])), "n=%d pos=%d i=%d: want NaN, got %g", n, pos, i, h[i])
						} else {
							require.Equal(t, want, h[i], "n=%d pos=%d i=%d", n, pos, i)
						}
					}
				}
			}
		}
	})
}

// FuzzFused compares the fused kernels on every path with the generic path and with Sum2
// followed by a one-source pass, for lengths 0–4096, several rows and independent unaligned starts.
func FuzzFused(f *testing.F) {
	envPath(f) // the test cache keys on the path chosen at init (env_test.go)
	f.Add(uint16(4096), uint8(1), uint8(0), uint8(0), uint8(0), float32(1), float32(1), uint64(1))
	f.Add(uint16(4099), uint8(3), uint8(1), uint8(5), uint8(15), float32(-0.37), float32(7.5), uint64(2))
	f.Add(uint16(17), uint8(9), uint8(3), uint8(2), uint8(1), float32(0), float32(-1), uint64(3))
	f.Fuzz(func(t *testing.T, n uint16, rows, offH, offX, offY uint8, a, b float32, seed uint64) {
		d := int(n) % 4097
		nr := int(rows) % 5
		if !finite32(a) || !finite32(b) || math.Abs(float64(a)) > 1e4 || math.Abs(float64(b)) > 1e4 {
			return // keeps a·x and b·y (|x| ≤ 1.5e30) inside float32: overflow is TestAddRows2SpecialValues'
		}
		r := rand.New(rand.NewPCG(seed, uint64(d)))
		x0, y0 := randVals(r, d, 1e30), randVals(r, d, 1e30)
		if nr <= 1 {
			compareFused(t, randVals(r, d, 1e30), x0, y0, a, b, int(offH%16), int(offX%16), int(offY%16))
			return
		}
		if d == 0 {
			return
		}
		orig := kernels.Path()
		t.Cleanup(func() { require.NoError(t, kernels.SetPath(orig)) })
		h0 := randVals(r, nr*d, 1e30)
		x, _ := offsetCopy(x0, int(offX%16))
		y, _ := offsetCopy(y0, int(offY%16))
		require.NoError(t, kernels.SetPath(kernels.PathGeneric))
		generic, _ := offsetCopy(h0, 0)
		kernels.AddRows2(generic, d, a, x, b, y)
		for _, p := range kernels.Paths() {
			require.NoError(t, kernels.SetPath(p))
			h, bh := offsetCopy(h0, int(offH%16))
			want := viaSum2(h, d, a, x, b, y)
			kernels.AddRows2(h, d, a, x, b, y)
			requireGuards(t, bh, int(offH%16), len(h0))
			require.Equal(t, bits(want), bits(h), "%s d=%d rows=%d: not Sum2 then AddRows bit for bit", p, d, nr)
			for i := range h {
				tol := 2 * fusedTol(float64(h0[i]), float64(a), float64(x0[i%d]), float64(b), float64(y0[i%d]))
				if math.Abs(float64(h[i])-float64(generic[i])) > tol {
					require.Failf(t, "path differs from generic", "%s d=%d i=%d got=%g generic=%g", p, d, i, h[i], generic[i])
				}
			}
		}
	})
}

func TestSum2(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(27, 28))
		for n := 0; n <= 130; n++ {
			x0, y0 := randVals(r, n, 1e30), randVals(r, n, 1e30)
			a, b := scales[r.IntN(len(scales))], scales[r.IntN(len(scales))]
			dst, bd := offsetCopy(randVals(r, n, 1e30), n%16)
			x, _ := offsetCopy(x0, (n+5)%16)
			y, _ := offsetCopy(y0, (n+9)%16)
			kernels.Sum2(dst, 1, x, 1, y)
			requireGuards(t, bd, n%16, n)
			for i := range dst {
				require.Equal(t, math.Float32bits(x0[i]+y0[i]), math.Float32bits(dst[i]), "n=%d i=%d", n, i)
			}
			kernels.Sum2(dst, a, x, b, y)
			zero := make([]float32, n)
			checkFused(t, dst, zero, a, func(i int) float32 { return x0[i] }, b, func(i int) float32 { return y0[i] })
		}
	})
}

func finite32(f float32) bool { return !math.IsNaN(float64(f)) && !math.IsInf(float64(f), 0) }
