package kernels_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/kernels"
)

// Tolerances. u is the float32 unit roundoff; eta bounds the absolute error
// of one rounding in the subnormal range (half an ulp of the smallest
// subnormal, 2^-150), since relative bounds fail there.
//
// Element update x = dst + s*v (Axpy, AddRows, GatherAdd with s = 1, and the
// last step of Clamp), computed r, exact x (the float64 reference is exact up
// to 2^-53|x|: the product of two float32 is exact in float64):
//
//   - fused (SIMD paths, and generic where the compiler fuses):
//     r = x(1+δ), |δ| ≤ u, so |r-x| ≤ u|x| ≤ u(|s·v|+|dst|).
//   - unfused (generic on GOAMD64=v1): p = s·v(1+δ1), r = (p+dst)(1+δ2), so
//     r-x = s·v·δ1(1+δ2) + x·δ2 and |r-x| ≤ u(1+u)|s·v| + u|x|
//     ≤ (2u+u²)(|s·v|+|dst|).
//
// Both are covered by  |r-x| ≤ 2.001·u·(|s·v|+|dst|) + 2·eta  (the 0.001u
// absorbs u² and the float64 reference error; 2·eta covers two roundings in
// the subnormal range). This is ~2 ulps of the larger term, so it still
// catches any wrong lane, wrong scale or skipped element.
//
// Dot: any summation order of n products (parallel accumulators, tree
// reduction, FMA or not) suffers at most n roundings per term (Higham,
// Thm 3.1/3.5), so |r-x| ≤ γ_n·Σ|a_i·b_i| + n·eta with γ_n = nu/(1-nu).
//
// Norm: squares summed in float64 (error ≤ γ_n^(64)·Σa², i.e. ≤ γ_n^(64)/2
// relative after the sqrt) then one float32 rounding: |r-x| ≤
// (u + n·2^-53)·1.01·x + eta.
//
// Clamp: see clampTol.
const (
	u   = 0x1p-24
	u64 = 0x1p-53
	eta = 0x1p-150
)

func gamma(n int) float64 {
	nu := float64(n) * u
	return nu / (1 - nu)
}

func axpyTol(dst, s, v float64) float64 {
	return 2.001*u*(math.Abs(s*v)+math.Abs(dst)) + 2*eta
}

// forEachPath runs f once per path the CPU supports (generic is always
// among them), restoring the original path afterwards.
func forEachPath(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	envPath(t)
	orig := kernels.Path()
	t.Cleanup(func() { require.NoError(t, kernels.SetPath(orig)) })
	paths := kernels.Paths()
	require.Contains(t, paths, kernels.PathGeneric)
	for _, p := range paths {
		require.NoError(t, kernels.SetPath(p))
		t.Run(p, f)
	}
}

// randVals returns n values mixing ordinary magnitudes, signed zeros, large
// (~1e30) and tiny (~1e-30, plus subnormal) magnitudes.
func randVals(r *rand.Rand, n int, big float64) []float32 {
	out := make([]float32, n)
	for i := range out {
		sign := 1.0
		if r.IntN(2) == 0 {
			sign = -1
		}
		switch k := r.IntN(20); {
		case k == 0:
			out[i] = float32(math.Copysign(0, sign))
		case k == 1:
			out[i] = float32(sign * big * (0.5 + r.Float64()))
		case k == 2:
			out[i] = float32(sign * 1e-30 * r.Float64())
		case k == 3:
			out[i] = float32(sign * 1e-44 * r.Float64()) // subnormal
		case k == 4:
			out[i] = float32(sign * float64(r.IntN(1000)))
		default:
			out[i] = float32(sign * r.Float64() * math.Pow(10, float64(r.IntN(7)-3)))
		}
	}
	return out
}

// offsetCopy returns a copy of src starting off elements into a fresh
// backing array, followed by guard elements, so kernels see unaligned starts
// and out-of-bounds writes are detectable.
func offsetCopy(src []float32, off int) (s, backing []float32) {
	backing = make([]float32, off+len(src)+16)
	for i := range backing {
		backing[i] = guard
	}
	copy(backing[off:], src)
	return backing[off : off+len(src) : off+len(src)], backing
}

const guard = float32(-12345.678)

func requireGuards(t *testing.T, backing []float32, off, n int) {
	t.Helper()
	for i := range off {
		require.Equal(t, guard, backing[i], "guard before slice clobbered")
	}
	for i := off + n; i < len(backing); i++ {
		require.Equal(t, guard, backing[i], "guard after slice clobbered")
	}
}

var scales = []float32{0, float32(math.Copysign(0, -1)), 1, -1, 0.37, 1e-3, -7.5, 123.4}

// checkUpdate asserts got ≈ dst + s*v elementwise within axpyTol, and exact
// sign of zero when the exact result is zero.
func checkUpdate(t *testing.T, got, dst []float32, s float32, v func(i int) float32) {
	t.Helper()
	for i := range got {
		d, sv := float64(dst[i]), float64(s)*float64(v(i))
		want := d + sv
		g := float64(got[i])
		tol := axpyTol(d, float64(s), float64(v(i)))
		if math.Abs(g-want) > tol {
			require.Failf(t, "mismatch", "i=%d dst=%g s=%g v=%g got=%g want=%g tol=%g",
				i, dst[i], s, v(i), got[i], want, tol)
		}
		if want == 0 {
			require.Equal(t, math.Signbit(want), math.Signbit(g), "sign of zero at %d", i)
		}
	}
}

func TestPaths(t *testing.T) {
	paths := kernels.Paths()
	require.NotEmpty(t, paths)
	require.Equal(t, kernels.PathGeneric, paths[len(paths)-1])
	// Every test restores the path it sets, so the one chosen at init is current.
	if env := envPath(t); contains(paths, env) {
		require.Equal(t, env, kernels.Path(), "%s=%s is honoured at init", kernels.EnvPath, env)
	} else {
		require.Equal(t, paths[0], kernels.Path(), "%s=%q: the best path", kernels.EnvPath, env)
	}
	require.ErrorIs(t, kernels.SetPath("nope"), kernels.ErrUnsupportedPath)
	require.Contains(t, paths, kernels.Path(), "failed SetPath must keep the path")
	orig := kernels.Path()
	defer func() { require.NoError(t, kernels.SetPath(orig)) }()
	for _, p := range []string{kernels.PathAVX512, kernels.PathAVX2, kernels.PathGeneric} {
		err := kernels.SetPath(p)
		if contains(paths, p) {
			require.NoError(t, err)
			require.Equal(t, p, kernels.Path())
		} else {
			require.ErrorIs(t, err, kernels.ErrUnsupportedPath)
		}
	}
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func TestAxpy(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(1, 2))
		for n := 0; n <= 130; n++ {
			for _, off := range []int{0, 1, 3, 7, 15} {
				s := scales[r.IntN(len(scales))]
				dst0 := randVals(r, n, 1e30)
				v0 := randVals(r, n, 1e30)
				dst, bd := offsetCopy(dst0, off)
				v, _ := offsetCopy(v0, (off*5+1)%16) // independent misalignment
				kernels.Axpy(dst, s, v)
				checkUpdate(t, dst, dst0, s, func(i int) float32 { return v0[i] })
				requireGuards(t, bd, off, n)
				require.Equal(t, v0, v, "v must not be modified")
			}
		}
	})
}

var dims = []int{1, 7, 64, 4096, 4099}

func TestAddRows(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(3, 4))
		for _, d := range dims {
			for _, rows := range []int{0, 1, 2, 3, 4, 5, 7, 8} { // the SIMD paths add blocks of four rows, then single rows
				for off := 1; off <= 15; off += 7 {
					s := scales[r.IntN(len(scales))]
					h0 := randVals(r, rows*d, 1e30)
					v0 := randVals(r, d, 1e30)
					h, bh := offsetCopy(h0, off)
					v, _ := offsetCopy(v0, 16-off)
					kernels.AddRows(h, d, s, v)
					checkUpdate(t, h, h0, s, func(i int) float32 { return v0[i%d] })
					requireGuards(t, bh, off, len(h0))
				}
			}
		}
		// Small d with many rows and all start offsets: exercises the
		// per-row tail handling.
		for d := 1; d <= 40; d++ {
			for off := 0; off < 16; off++ {
				h0 := randVals(r, 9*d, 1e30)
				v0 := randVals(r, d, 1e30)
				h, bh := offsetCopy(h0, off)
				kernels.AddRows(h, d, -0.37, v0)
				checkUpdate(t, h, h0, -0.37, func(i int) float32 { return v0[i%d] })
				requireGuards(t, bh, off, len(h0))
			}
		}
	})
}

func TestGatherAdd(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(5, 6))
		for _, d := range dims {
			const nrows = 4
			table := randVals(r, nrows*d, 1e30)
			for i := range d {
				table[i] = float32(math.NaN()) // row 0 must never be read
			}
			idx := []int32{0, 2, 3, 2, 0, 1, 1, 3}
			h0 := randVals(r, len(idx)*d, 1e30)
			h, bh := offsetCopy(h0, 5)
			kernels.GatherAdd(h, d, table, idx)
			requireGuards(t, bh, 5, len(h0))
			for tt, k := range idx {
				got, want := h[tt*d:(tt+1)*d], h0[tt*d:(tt+1)*d]
				if k == 0 {
					require.Equal(t, bits(want), bits(got), "row %d with idx 0 must be untouched", tt)
					continue
				}
				row := table[int(k)*d : (int(k)+1)*d]
				checkUpdate(t, got, want, 1, func(i int) float32 { return row[i] })
			}
		}
	})
}

// bits compares float slices bit-for-bit (NaN-safe, sign-of-zero-safe).
func bits(x []float32) []uint32 {
	out := make([]uint32, len(x))
	for i, f := range x {
		out[i] = math.Float32bits(f)
	}
	return out
}

func TestGatherAddRepeatedIndex(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		const d = 33
		table := make([]float32, 3*d)
		for i := d; i < len(table); i++ {
			table[i] = float32(i / d) // row k is all k
		}
		h := make([]float32, 5*d)
		kernels.GatherAdd(h, d, table, []int32{2, 2, 0, 1, 2})
		kernels.GatherAdd(h, d, table, []int32{2, 2, 0, 1, 2})
		for tt, want := range []float32{4, 4, 0, 2, 4} {
			for i := range d {
				require.Equal(t, want, h[tt*d+i])
			}
		}
	})
}

// dotRef returns the float64 dot product and Σ|a_i b_i|.
func dotRef(a, b []float32) (x, abs float64) {
	for i := range a {
		p := float64(a[i]) * float64(b[i])
		x += p
		abs += math.Abs(p)
	}
	return x, abs
}

func TestDot(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(7, 8))
		lens := []int{}
		for n := 0; n <= 130; n++ {
			lens = append(lens, n)
		}
		lens = append(lens, dims...)
		for _, n := range lens {
			for _, off := range []int{0, 1, 9, 15} {
				// 1e15 keeps products (≤ ~1e30·d) far from float32 overflow.
				a0, b0 := randVals(r, n, 1e15), randVals(r, n, 1e15)
				a, _ := offsetCopy(a0, off)
				b, _ := offsetCopy(b0, (off+3)%16)
				got := float64(kernels.Dot(a, b))
				want, abs := dotRef(a0, b0)
				tol := gamma(n)*abs + float64(n)*eta
				require.InDelta(t, want, got, tol, "n=%d off=%d", n, off)
			}
		}
	})
}

func TestNorm(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(9, 10))
		lens := []int{}
		for n := 0; n <= 130; n++ {
			lens = append(lens, n)
		}
		lens = append(lens, dims...)
		for _, n := range lens {
			for _, off := range []int{0, 2, 13} {
				a0 := randVals(r, n, 1e30)
				a, _ := offsetCopy(a0, off)
				got := kernels.Norm(a)
				_, ss := dotRef(a0, a0)
				want := math.Sqrt(ss)
				tol := (u+float64(n)*u64)*1.01*want + eta
				require.InDelta(t, want, got, tol, "n=%d off=%d", n, off)
			}
		}
		// Values near MaxFloat32 must not overflow the accumulation.
		big := []float32{math.MaxFloat32 / 4, math.MaxFloat32 / 4, math.MaxFloat32 / 4}
		require.InEpsilon(t, math.Sqrt(3)*math.MaxFloat32/4, kernels.Norm(big), 2*u)
	})
}

// clampTol bounds |computed - exact| for one element of Clamp (see package
// comment of this file for u, eta). With S = Σ|h_j u_j| and exact p, c =
// clamp(p)-p, k = strength·c:
//
//	Ep = γ_d·S + d·eta                      (Dot)
//	|c' - c| ≤ Ep + u·|c'|                  (clamp(p)-p is 1-Lipschitz, one rounding)
//	Ek = |strength|·(1.001·Ep + 2.001·u·|c|) (plus the rounding of strength·c')
//	elem: |k'-k|·|u_i| + axpyTol(h_i, k', u_i) with |k'| ≤ |k| + Ek.
func clampTol(d int, S, c, strength, hi, ui float64) float64 {
	ep := gamma(d)*S + float64(d)*eta
	ek := math.Abs(strength) * (1.001*ep + 2.001*u*(math.Abs(c)+ep))
	k := math.Abs(strength*c) + ek
	return ek*math.Abs(ui) + axpyTol(hi, k, ui)
}

func unitVec(r *rand.Rand, d int) []float32 {
	v := make([]float64, d)
	var ss float64
	for i := range v {
		v[i] = r.NormFloat64()
		ss += v[i] * v[i]
	}
	out := make([]float32, d)
	for i := range v {
		out[i] = float32(v[i] / math.Sqrt(ss))
	}
	return out
}

func TestClamp(t *testing.T) {
	type bounds struct{ lo, hi, strength float32 }
	cases := []bounds{
		{0, 0, 1},     // directional ablation
		{-1, 1, 1},    // window
		{0.5, 2, 0.5}, // partial strength, window off zero
		{3, 3, -1},    // negative strength pushes away
	}
	forEachPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(11, 12))
		for _, d := range dims {
			for _, rows := range []int{0, 1, 3} {
				for _, bc := range cases {
					u0 := unitVec(r, d)
					h0 := randVals(r, rows*d, 1e30)
					h, bh := offsetCopy(h0, 3)
					uv, _ := offsetCopy(u0, 11)
					kernels.Clamp(h, d, uv, bc.lo, bc.hi, bc.strength)
					requireGuards(t, bh, 3, len(h0))
					for tt := range rows {
						row0 := h0[tt*d : (tt+1)*d]
						p, S := dotRef(row0, u0)
						c := math.Min(math.Max(p, float64(bc.lo)), float64(bc.hi)) - p
						for i := range d {
							want := float64(row0[i]) + float64(bc.strength)*c*float64(u0[i])
							tol := clampTol(d, S, c, float64(bc.strength), float64(row0[i]), float64(u0[i]))
							require.InDelta(t, want, float64(h[tt*d+i]), tol, "d=%d row=%d i=%d", d, tt, i)
						}
					}
				}
			}
		}
	})
}

func TestClampAblates(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(13, 14))
		const d, rows = 4096, 4
		uv := unitVec(r, d)
		h := make([]float32, rows*d)
		for i := range h {
			h[i] = float32(r.NormFloat64())
		}
		kernels.Clamp(h, d, uv, 0, 0, 1)
		for tt := range rows {
			row := h[tt*d : (tt+1)*d]
			// Residual projection is rounding noise relative to |row|.
			require.Less(t, math.Abs(float64(kernels.Dot(row, uv))), 1e-4*kernels.Norm(row))
		}
	})
}

func TestSpecialValues(t *testing.T) {
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	forEachPath(t, func(t *testing.T) {
		for _, n := range []int{1, 5, 16, 37, 64, 100} {
			for pos := 0; pos < n; pos += 1 + n/7 {
				// Axpy: NaN/Inf in v or dst affect exactly their element.
				type tc struct {
					dst, v, s, want float32
				}
				for _, c := range []tc{
					{1, nan, 2, nan},
					{nan, 1, 2, nan},
					{1, inf, 2, inf},
					{1, inf, -2, -inf},
					{inf, -inf, 1, nan},
					{-inf, 1, 1, -inf},
					{1, inf, 0, nan}, // s == 0 is not special-cased: 0*Inf = NaN
					{1, 1, inf, inf},
				} {
					dst := make([]float32, n)
					v := make([]float32, n)
					for i := range dst {
						dst[i], v[i] = 1, 1
					}
					dst[pos], v[pos] = c.dst, c.v
					kernels.Axpy(dst, c.s, v)
					if c.s == inf {
						for i := range dst {
							require.Equal(t, inf, dst[i])
						}
						continue
					}
					for i := range dst {
						if i == pos {
							if math.IsNaN(float64(c.want)) {
								require.True(t, math.IsNaN(float64(dst[i])), "pos %d", i)
							} else {
								require.Equal(t, c.want, dst[i])
							}
						} else {
							require.Equal(t, 1+c.s, dst[i])
						}
					}
				}
				// Dot / Norm.
				a := make([]float32, n)
				b := make([]float32, n)
				for i := range a {
					a[i], b[i] = 0.5, 2
				}
				a[pos] = nan
				require.True(t, math.IsNaN(float64(kernels.Dot(a, b))))
				require.True(t, math.IsNaN(float64(kernels.Norm(a))))
				a[pos] = inf
				require.Equal(t, inf, kernels.Dot(a, b))
				require.Equal(t, math.Inf(1), kernels.Norm(a))
				a[pos], b[pos] = inf, -1
				require.Equal(t, -inf, kernels.Dot(a, b))
				if n > 1 {
					b[(pos+1)%n], a[(pos+1)%n] = 1, inf
					require.True(t, math.IsNaN(float64(kernels.Dot(a, b))), "Inf - Inf")
				}
			}
		}
		// Clamp: a NaN in one row poisons exactly that row.
		const d = 19
		uv := make([]float32, d)
		uv[0] = 1
		h := make([]float32, 3*d)
		for i := range h {
			h[i] = 2
		}
		h[d+5] = nan
		kernels.Clamp(h, d, uv, 0, 0, 1)
		for i := range d {
			require.True(t, math.IsNaN(float64(h[d+i])))
			want := float32(2)
			if i == 0 {
				want = 0
			}
			require.Equal(t, want, h[i])
			require.Equal(t, want, h[2*d+i])
		}
	})
}

// TestAddRowsShapes: on every path AddRows's shape checks (in assembly on amd64, in Go
// elsewhere and on the generic path) panic with the check's own message and leave h as it
// was, and every good shape, down to no rows, is accepted.
func TestAddRowsShapes(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		f := make([]float32, 24)
		for i := range f {
			f[i] = float32(i)
		}
		want := append([]float32(nil), f...)
		bad := []struct {
			name, msg string
			h         []float32
			d         int
			v         []float32
		}{
			{"d=0", kernels.MsgDim, f[:0], 0, f[:0]},
			{"d<0", kernels.MsgDim, f[:8], -4, f[:4]},
			{"d<0, len(v)=d", kernels.MsgDim, f[:8], -1, f[:0]},
			{"not a multiple", kernels.MsgShape, f[:10], 4, f[16:20]},
			{"not a multiple, one row and a bit", kernels.MsgShape, f[:5], 4, f[16:20]},
			{"shorter than a row", kernels.MsgShape, f[:3], 4, f[16:20]},
			{"len(v) < d", kernels.MsgShape, f[:8], 4, f[16:19]},
			{"len(v) > d", kernels.MsgShape, f[:8], 4, f[16:21]},
			{"len(v) = len(h) != d", kernels.MsgShape, f[:8], 4, f[8:16]},
		}
		for _, c := range bad {
			require.PanicsWithValue(t, c.msg, func() { kernels.AddRows(c.h, c.d, 1, c.v) }, c.name)
			require.Equal(t, want, f, "%s: h changed", c.name)
		}
		good := []struct {
			h []float32
			d int
		}{{f[:0], 4}, {f[:4], 4}, {f[:16], 4}, {f[:12], 3}, {f[:15], 5}, {f[:7], 7}, {f[:14], 7}, {f[:16], 1}}
		for _, c := range good {
			v := make([]float32, c.d)
			for i := range v {
				v[i] = 1
			}
			g := append([]float32(nil), c.h...)
			kernels.AddRows(g, c.d, 2, v)
			for i := range g {
				require.Equal(t, c.h[i]+2, g[i], "d=%d len(h)=%d [%d]", c.d, len(c.h), i)
			}
		}
	})
}

func TestPanics(t *testing.T) {
	envPath(t) // the test cache keys on the path chosen at init (env_test.go)
	f := make([]float32, 12)
	table := make([]float32, 8) // 2 rows of d=4
	cases := []struct {
		name string
		fn   func()
	}{
		{"Axpy len", func() { kernels.Axpy(f[:3], 1, f[:4]) }},
		{"AddRows d=0", func() { kernels.AddRows(f[:0], 0, 1, f[:0]) }},
		{"AddRows d<0", func() { kernels.AddRows(f, -4, 1, f[:4]) }},
		{"AddRows not multiple", func() { kernels.AddRows(f[:10], 4, 1, f[:4]) }},
		{"AddRows d!=len(v)", func() { kernels.AddRows(f, 4, 1, f[:3]) }},
		{"GatherAdd idx len", func() { kernels.GatherAdd(f, 4, table, []int32{0, 1}) }},
		{"GatherAdd idx range", func() { kernels.GatherAdd(f, 4, table, []int32{0, 1, 2}) }},
		{"GatherAdd idx negative", func() { kernels.GatherAdd(f, 4, table, []int32{0, -1, 1}) }},
		{"GatherAdd table shape", func() { kernels.GatherAdd(f, 4, table[:7], []int32{0, 0, 0}) }},
		{"Clamp shape", func() { kernels.Clamp(f, 4, f[:5], 0, 0, 1) }},
		{"AddRows2 d=0", func() { kernels.AddRows2(f[:0], 0, 1, f[:0], 1, f[:0]) }},
		{"AddRows2 not multiple", func() { kernels.AddRows2(f[:10], 4, 1, f[:4], 1, f[:4]) }},
		{"AddRows2 d!=len(x)", func() { kernels.AddRows2(f, 4, 1, f[:3], 1, f[:4]) }},
		{"AddRows2 d!=len(y)", func() { kernels.AddRows2(f, 4, 1, f[:4], 1, f[:3]) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { require.Panics(t, c.fn) })
	}
	// A bad index panics before any row is modified.
	h := []float32{1, 1, 1, 1, 2, 2, 2, 2}
	tbl := []float32{0, 0, 0, 0, 5, 5, 5, 5}
	require.Panics(t, func() { kernels.GatherAdd(h, 4, tbl, []int32{1, 7}) })
	require.Equal(t, []float32{1, 1, 1, 1, 2, 2, 2, 2}, h)
	// Empty inputs are fine.
	require.NotPanics(t, func() {
		kernels.Axpy(nil, 1, nil)
		kernels.AddRows(nil, 3, 1, []float32{1, 2, 3})
		kernels.GatherAdd(nil, 3, nil, nil)
		kernels.AddRows2(nil, 3, 1, []float32{1, 2, 3}, 1, []float32{4, 5, 6})
		require.Equal(t, float64(0), kernels.Norm(nil))
	})
}

// TestEnvPath re-runs this test binary with SHMSTEER_KERNELS set and checks
// the path chosen at init: a supported name is honoured, an unknown or
// unsupported one falls back to the best path without crashing.
func TestEnvPath(t *testing.T) {
	envPath(t) // the test cache keys on the path chosen at init (env_test.go)
	if os.Getenv("SHMSTEER_KERNELS_CHILD") == "1" {
		fmt.Print("PATH=" + kernels.Path())
		return
	}
	best := kernels.Paths()[0]
	for env, want := range map[string]string{
		"generic": "generic",
		"bogus":   best,
		"":        best,
		"avx2":    pick(kernels.PathAVX2, best),
		"avx512":  pick(kernels.PathAVX512, best),
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestEnvPath$")
		cmd.Env = append(os.Environ(), "SHMSTEER_KERNELS_CHILD=1", kernels.EnvPath+"="+env)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, string(out))
		require.Contains(t, string(out), "PATH="+want, "env %q", env)
	}
}

// pick returns p if this CPU supports it, else fallback.
func pick(p, fallback string) string {
	if contains(kernels.Paths(), p) {
		return p
	}
	return fallback
}
