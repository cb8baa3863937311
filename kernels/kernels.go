// Package kernels owns the in-place float32 vector arithmetic used by
// steering: the row-wise adds, gathers, projections and reductions that run
// at every hook of every generation step, and the bfloat16 widening and
// narrowing (bf16.go, pure Go) that lets a bfloat16 block use them.
//
// It knows nothing about shared-memory regions, steering vectors, layers or
// hooks: callers hand it plain []float32 slices (which may alias a mapped
// region) and it reads/writes exactly the elements the shapes describe. It
// never allocates, retains slices, or spawns goroutines.
//
// # Implementation paths
//
// Each operation has three implementations ("paths"): "avx512" (AVX-512F,
// 512-bit FMA with K-masked tails), "avx2" (AVX2+FMA, 256-bit with scalar
// tails) and "generic" (pure Go, used on every non-amd64 build and with the
// purego build tag). A fourth, "avx512split", is "avx512" with the add kernel
// (AddRows) written for CPUs that run a 512-bit operation as two 256-bit halves
// (AMD Zen 4: blocks of four rows, 256-bit vectors in a single row); it is the
// first choice there and offered on every AVX-512 CPU. On Intel the "avx512"
// add is tuned by CPUID's vendor (avx512TuningByCPUID): two vectors per
// iteration in a single row, and blocks of four rows from 32 MiB of h; the
// tests run every path under every tuning. The best path the CPU supports is
// chosen once at init with golang.org/x/sys/cpu (and, between the two AVX-512
// ones, CPUID's vendor and family). The environment variable
// SHMSTEER_KERNELS (generic|avx2|avx512|avx512split) forces a path at init; an unknown or unsupported
// name is ignored and the best supported path is used (no error, no crash),
// so a config copied between machines still runs. Path reports the choice.
//
// # Numerics
//
// Kernels are branch-free on values: NaN and ±Inf propagate per IEEE 754 (in
// particular s == 0 still computes 0*v, so 0*Inf yields NaN). The SIMD paths
// use fused multiply-add (one rounding for dst + s*v); the generic path may
// or may not be fused depending on GOAMD64/GOARCH. Results therefore differ
// between paths by at most a couple of ulps of |s*v|+|dst| per element; the
// tests assert the bound derived in kernels_test.go. The two-source kernels
// (AddRows2, SumAddRows) sum the sources first and add the sum to h,
// as a table of composed rows (source sum per row) gather-added would: with
// unit coefficients they compute h + (x + y) in float32 bit for bit on every
// path.
// Clamp's projection sums in float32 with several accumulators (the order
// differs from a sequential loop); Norm accumulates squares in float64 so
// that values up to the float32 maximum do not overflow the intermediate sum.
package kernels

import (
	"errors"
	"math"
	"os"
)

// ErrUnsupportedPath is returned by SetPath when the named path is unknown or
// the CPU (or build) does not support it.
var ErrUnsupportedPath = errors.New("shmsteer: unsupported kernel path")

// EnvPath is the environment variable read once at init to force a path.
const EnvPath = "SHMSTEER_KERNELS"

// Path names.
const (
	PathAVX512 = "avx512"
	// PathAVX512Split is AVX-512 with the add kernel tuned for CPUs that run a 512-bit
	// operation as two 256-bit halves (AMD Zen 4): chosen first there, offered on every
	// AVX-512 CPU.
	PathAVX512Split = "avx512split"
	PathAVX2        = "avx2"
	PathGeneric     = "generic"
)

// impl identifies one path. Kernels are selected by id (kernels_amd64.go)
// rather than through func values: a direct call to an assembly (ABI0)
// function needs no ABI wrapper, while a func value of one goes through a
// wrapper that spills every argument. At 16 KiB per call (~115 ns) the call
// overhead is a few percent, which is the margin against C. id comes first:
// AddRows's assembly entry (addRowsEntry) reads cur.id as cur's first word.
type impl struct {
	id int
	// blocksFrom, ymmFrom and pairs tune the avx512 path's add to the CPU (avx512Tuning;
	// other paths ignore them): from blocksFrom floats of h it adds in blocks of four rows
	// (the avx512split body); below that, from ymmFrom floats, with the avx2 path's body
	// (256-bit vectors, blocks of four rows); below both, with pairs, one row at a time two
	// vectors per iteration rather than one. addRowsAVX512Body reads them as cur's second
	// word, its fourth and the byte after the second (TestCurIDFirst).
	blocksFrom int
	pairs      bool
	ymmFrom    int
	name       string
}

// Path ids.
const (
	idGeneric = iota
	idAVX2
	idAVX512
	idAVX512Split
)

// Primitive kernels, per path, assume the exported wrappers validated shapes:
//
//	addRows:  len(v) > 0 and len(h) % len(v) == 0; h[t] += s*v for every row.
//	addRows2: len(x) == len(y) > 0 and len(h) % len(x) == 0;
//	          h[t] += a*x + b*y for every row (the sum rounded first).
//	sum2:     len(dst) == len(x) == len(y) > 0; dst = a*x + b*y (generic path only).
//	dot:      len(a) == len(b).
//	sumSq:    Σ a[i]² accumulated in float64.

var (
	// supported lists usable paths, best first; generic is always last.
	supported []impl
	// cur is the path in use. Plain (non-atomic) variable: SetPath is
	// documented as not safe concurrently with kernel calls, which keeps the
	// hot path free of atomics.
	cur impl
)

func init() {
	supported = append(archImpls(), genericImpl)
	cur = supported[0]
	if name := os.Getenv(EnvPath); name != "" {
		// Unsupported or unknown names deliberately fall back to the best
		// path: the env var is a tuning/debug knob, not a requirement.
		_ = SetPath(name)
	}
}

// Path names the implementation in use: "avx512", "avx512split", "avx2" or "generic".
func Path() string { return cur.name }

// Paths lists the paths this CPU supports, best first (always includes
// "generic").
func Paths() []string {
	out := make([]string, len(supported))
	for i, p := range supported {
		out[i] = p.name
	}
	return out
}

// SetPath forces a path (for tests and benchmarks). It returns
// ErrUnsupportedPath if the name is unknown or the CPU lacks it, leaving the
// current path unchanged. Not safe concurrently with kernel calls.
func SetPath(name string) error {
	for _, p := range supported {
		if p.name == name {
			cur = p
			return nil
		}
	}
	return ErrUnsupportedPath
}

// Panic messages: programming errors, so they carry no data values.
const (
	msgLen      = "kernels: slice length mismatch"
	msgShape    = "kernels: len(h) is not a multiple of d, or d != len(vector)"
	msgDim      = "kernels: d must be positive"
	msgIdxLen   = "kernels: len(idx) != number of rows"
	msgIdxRange = "kernels: gather index out of range"
	msgRows     = "kernels: row range out of bounds"
)

// checkRows validates a T×d row-major matrix against a length-d vector and
// returns T.
func checkRows(h []float32, d int, vec []float32) int {
	if d <= 0 {
		panic(msgDim)
	}
	if len(vec) != d {
		panic(msgShape)
	}
	if len(h) == d {
		// Single row (a decode step): skip the integer division, which
		// costs a few ns per call and shows at 16 KiB.
		return 1
	}
	if uint(len(h))%uint(d) != 0 {
		panic(msgShape)
	}
	return int(uint(len(h)) / uint(d))
}

// Axpy computes dst[i] += s*v[i]. It panics if len(v) != len(dst).
func Axpy(dst []float32, s float32, v []float32) {
	if len(v) != len(dst) {
		panic(msgLen)
	}
	if len(v) == 0 {
		return
	}
	addRowsImpl(dst, v, s)
}

// AddRows treats h as a T×d row-major matrix (len(h) must be a multiple of
// d, d == len(v), d > 0) and computes h[t] += s*v for every row t. It panics
// on a bad shape.
func AddRows(h []float32, d int, s float32, v []float32) {
	// Inlined into its callers, so a direct call of AddRows is one call of
	// addRowsEntry, which on amd64 is assembly that checks the shape and runs
	// the SIMD path with no Go frame in between (kernels_amd64.s); elsewhere,
	// and for a bad shape or the generic path, it is addRowsSlow.
	addRowsEntry(h, d, s, v)
}

// addRowsSlow is AddRows in Go: the shape checks (panicking on a bad shape),
// then the path in use.
//
//lint:ignore U1000 on amd64 reached only from assembly (addRowsEntry's tail jump)
func addRowsSlow(h []float32, d int, s float32, v []float32) {
	checkRows(h, d, v)
	addRowsImpl(h, v, s)
}

// AddRows2 is AddRows with two sources: h[t] += a*x + b*y for every row t of
// the T×d matrix h (d == len(x) == len(y)), reading and writing h once. The
// sum of the two sources is rounded first (the product a*x, then a fused b*y
// added to it), then added to h[t], so with a = b = 1 it is h + (x + y) in
// float32 on every path. For many rows, SumAddRows computes the same bits
// and reads one source stream instead of two. It panics on a bad shape.
func AddRows2(h []float32, d int, a float32, x []float32, b float32, y []float32) {
	checkRows(h, d, x)
	if len(y) != d {
		panic(msgShape)
	}
	if !addRows2SIMD(h, x, y, a, b, cur.id) {
		addRows2Generic(h, x, y, a, b)
	}
}

// checkGather validates the shapes for GatherAdd and every
// index before any row is modified, so a panic leaves h untouched.
func checkGather(h []float32, d int, table []float32, idx []int32) {
	if d <= 0 {
		panic(msgDim)
	}
	if len(h)%d != 0 || len(table)%d != 0 {
		panic(msgShape)
	}
	if len(idx) != len(h)/d {
		panic(msgIdxLen)
	}
	rows := len(table) / d
	for _, k := range idx {
		if k < 0 || int(k) >= rows {
			panic(msgIdxRange)
		}
	}
}

// GatherAdd treats h as T×d and table as R×d (both row-major). For each row
// t with idx[t] != 0 it computes h[t] += table[idx[t]]. Row 0 of table is the
// "no steering" row and is skipped without being read, so h[t] stays
// bit-identical. Repeated indices are fine. It panics, before modifying h, if
// len(idx) != T, a shape is not a multiple of d, or an index is outside
// [0, R). Its caller is the bench: the plain gather-add a decode step's
// figures are held to (bench/decodebench.go, stepbench.go).
func GatherAdd(h []float32, d int, table []float32, idx []int32) {
	checkGather(h, d, table, idx)
	for t, k := range idx {
		if k != 0 {
			// fma(1, x, y) rounds exactly like x+y, so the axpy kernel
			// doubles as a plain add.
			addRowsImpl(h[t*d:(t+1)*d], table[int(k)*d:(int(k)+1)*d], 1)
		}
	}
}

// Clamp treats h as T×d and, for the direction u (len d, expected to be unit
// length; it is not normalized here) and each row t, computes
// p = dot(h[t], u) and h[t] += strength*(clamp(p, lo, hi) - p)*u, where
// clamp(p, lo, hi) = min(max(p, lo), hi). lo = hi = 0 with strength = 1 is
// directional ablation. A NaN in p, lo or hi makes the whole row NaN (the
// coefficient is NaN and NaN*0 is NaN). Panics on a bad shape.
//
// To act on rows [r0, r1) call Clamp on the sub-slice h[r0*d:r1*d].
func Clamp(h []float32, d int, u []float32, lo, hi, strength float32) {
	rows := checkRows(h, d, u)
	for t := range rows {
		row := h[t*d : (t+1)*d]
		p := dotImpl(row, u)
		// Builtin min/max propagate NaN, keeping this branch-free on values.
		c := min(max(p, lo), hi) - p
		addRowsImpl(row, u, strength*c)
	}
}

// Norm returns the L2 norm of a, in float64: squares are accumulated in
// float64, so no float32 input overflows the sum, and a caller normalizing a
// direction divides by the unrounded norm.
func Norm(a []float32) float64 {
	return math.Sqrt(sumSqImpl(a))
}
