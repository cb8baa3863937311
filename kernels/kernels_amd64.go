//go:build amd64 && !purego

package kernels

import "golang.org/x/sys/cpu"

// Assembly kernels (kernels_amd64.s). Preconditions are those listed in
// kernels.go; the exported wrappers enforce them.

// addRowsEntry is AddRows (kernels_amd64.s): the shape checks and the SIMD
// path's kernel reached without a call, addRowsSlow by a tail jump otherwise.
//
//go:noescape
func addRowsEntry(h []float32, d int, s float32, v []float32)

// addRowsSIMD runs the SIMD kernel for path, idAVX512 or idAVX2 (callers run
// the generic path themselves).
//
//go:noescape
func addRowsSIMD(h, v []float32, s float32, path int)

// addRowsAVX512 and addRowsAVX2 are reached only by addRowsSIMD's tail call in assembly;
// their Go declarations give vet the frame layout.
//
//lint:ignore U1000 called from assembly (addRowsSIMD)
//go:noescape
func addRowsAVX512(h, v []float32, s float32)

//go:noescape
func dotAVX512(a, b []float32) float32

//go:noescape
func sumSqAVX512(a []float32) float64

//lint:ignore U1000 called from assembly (addRowsSIMD)
//go:noescape
func addRowsAVX2(h, v []float32, s float32)

//go:noescape
func dotAVX2(a, b []float32) float32

//go:noescape
func sumSqAVX2(a []float32) float64

// addRows2SIMD is addRowsSIMD for the fused two-source add (addRows2 in kernels.go).
//
//go:noescape
func addRows2SIMD(h, x, y []float32, a, b float32, path int) bool

//lint:ignore U1000 called from assembly (addRows2SIMD)
//go:noescape
func addRows2AVX512(h, x, y []float32, a, b float32)

//lint:ignore U1000 called from assembly (addRows2SIMD)
//go:noescape
func addRows2AVX2(h, x, y []float32, a, b float32)

// sum2AVX512 and sum2AVX2 write h = a*x + b*y (h is not read).
//
//go:noescape
func sum2AVX512(h, x, y []float32, a, b float32)

//go:noescape
func sum2AVX2(h, x, y []float32, a, b float32)

// archImpls returns the SIMD paths this CPU supports, best first.
// x/sys/cpu also checks that the OS saves the wider register state (XCR0).
func archImpls() []impl {
	var out []impl
	// The AVX-512 kernels use VEX-encoded FMA in scalar tails, hence the
	// extra AVX2/FMA requirement (every AVX-512F CPU has them anyway).
	if cpu.X86.HasAVX512F && cpu.X86.HasAVX2 && cpu.X86.HasFMA {
		out = append(out, impl{name: PathAVX512, id: idAVX512})
	}
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA {
		out = append(out, impl{name: PathAVX2, id: idAVX2})
	}
	return out
}

// Dispatchers. The path is a switch on an int rather than a func value: a
// direct call to an assembly (ABI0) function needs no ABI wrapper.

func addRowsImpl(h, v []float32, s float32) {
	if cur.id == idGeneric {
		addRowsGeneric(h, v, s)
		return
	}
	addRowsSIMD(h, v, s, cur.id)
}

func addRows2Impl(h, x, y []float32, a, b float32) {
	if !addRows2SIMD(h, x, y, a, b, cur.id) {
		addRows2Generic(h, x, y, a, b)
	}
}

func sum2Impl(dst, x, y []float32, a, b float32) {
	switch cur.id {
	case idAVX512:
		sum2AVX512(dst, x, y, a, b)
	case idAVX2:
		sum2AVX2(dst, x, y, a, b)
	default:
		sum2Generic(dst, x, y, a, b)
	}
}

func dotImpl(a, b []float32) float32 {
	switch cur.id {
	case idAVX512:
		return dotAVX512(a, b)
	case idAVX2:
		return dotAVX2(a, b)
	default:
		return dotGeneric(a, b)
	}
}

func sumSqImpl(a []float32) float64 {
	switch cur.id {
	case idAVX512:
		return sumSqAVX512(a)
	case idAVX2:
		return sumSqAVX2(a)
	default:
		return sumSqGeneric(a)
	}
}
