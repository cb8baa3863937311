//go:build amd64 && !purego

package kernels

import (
	"math"

	"golang.org/x/sys/cpu"
)

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

//lint:ignore U1000 called from assembly (addRowsSIMD)
//go:noescape
func addRowsAVX512Split(h, v []float32, s float32)

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

// archImpls returns the SIMD paths this CPU supports, best first.
// x/sys/cpu also checks that the OS saves the wider register state (XCR0).
func archImpls() []impl {
	var out []impl
	// The AVX-512 kernels use VEX-encoded FMA in scalar tails, hence the
	// extra AVX2/FMA requirement (every AVX-512F CPU has them anyway).
	if cpu.X86.HasAVX512F && cpu.X86.HasAVX2 && cpu.X86.HasFMA {
		full := impl{name: PathAVX512, id: idAVX512}
		full.blocksFrom, full.ymmFrom, full.pairs = avx512Tuning()
		split := impl{name: PathAVX512Split, id: idAVX512Split}
		if splits512() {
			full, split = split, full
		}
		out = append(out, full, split)
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

func dotImpl(a, b []float32) float32 {
	switch cur.id {
	case idAVX512, idAVX512Split:
		return dotAVX512(a, b)
	case idAVX2:
		return dotAVX2(a, b)
	default:
		return dotGeneric(a, b)
	}
}

func sumSqImpl(a []float32) float64 {
	switch cur.id {
	case idAVX512, idAVX512Split:
		return sumSqAVX512(a)
	case idAVX2:
		return sumSqAVX2(a)
	default:
		return sumSqGeneric(a)
	}
}

// cpuid executes CPUID with EAX = leaf, ECX = 0 (kernels_amd64.s).
//
//go:noescape
func cpuid(leaf uint32) (a, b, c, d uint32)

// splits512 reports whether this CPU executes a 512-bit operation as two 256-bit halves, the
// "avx512split" path's premise (splitsByCPUID).
func splits512() bool {
	_, b, c, d := cpuid(0)
	a, _, _, _ := cpuid(1)
	return splitsByCPUID(b, c, d, a)
}

// avx512Tuning is the avx512 path's impl.blocksFrom, impl.ymmFrom and impl.pairs on this CPU
// (avx512TuningByCPUID).
func avx512Tuning() (blocksFrom, ymmFrom int, pairs bool) {
	_, b, c, d := cpuid(0)
	return avx512TuningByCPUID(b, c, d)
}

// intelBlocksFrom is blocksFrom on Intel: 32 MiB of h. On the Xeon (family 6 model 0xcf,
// 2 MiB of L2 a core, 260 MiB of L3) it was measured on, one row at a time and blocks of four
// rows ran alike against gcc's loop from 4 to 32 MiB of h (within 2%, in process, alternating
// with gcc on the same buffers), while at 64 MiB blocks ran 0.91-0.96x gcc's time where single
// rows ran 1.00-1.03x, and in the bench 0.93-1.07x at 64 MiB against 1.05-1.13x and
// 0.89-0.92x at 1 GiB against 0.96-1.02x. Below that size the blocks lost: 1.08x at 256 KiB
// and the prefill step 1.09-1.10x its kernel, against 1.05x and 1.02-1.05x.
const intelBlocksFrom = 32 << 20 / 4

// intelYmmFrom is ymmFrom on Intel: 64 KiB of h. On a Xeon with 2 MiB of L2 a core and
// 480 MiB of L3 (CPUID family 6, model 0xa7 as its VM reported it), the avx2 body against the
// two-vector 512-bit loop, in process (go test -bench, three runs of each): 1.26-1.34x the
// time at 16 and 32 KiB of h, 0.92x at 64 KiB, 0.96x at 128 KiB, 1.00x at 256 KiB, 0.98x at
// 512 KiB, 0.95x at 1 MiB, 0.98-0.99x at 2 and 4 MiB; in the bench at 256 KiB, 0.981-1.001x the
// best gcc variant where the 512-bit loops ran 1.013-1.025x (both bodies, alternating runs).
const intelYmmFrom = 64 << 10 / 4

// avx512TuningByCPUID is avx512Tuning from CPUID leaf 0's vendor words (EBX, ECX, EDX): on
// Intel, blocks from intelBlocksFrom, the avx2 body from intelYmmFrom below that, and two
// vectors per iteration below both (addRowsAVX512PairsBody); elsewhere one row at a time, one
// vector per iteration, always (on the AMD Zen 5 blocks of four rows ran 1.22-1.55x gcc from
// 256 KiB to 64 MiB, and two vectors per iteration 98-100 ns at 16 KiB where one took
// 85-86 ns).
func avx512TuningByCPUID(vendorB, vendorC, vendorD uint32) (blocksFrom, ymmFrom int, pairs bool) {
	if vendorB == 0x756e6547 && vendorD == 0x49656e69 && vendorC == 0x6c65746e { // "GenuineIntel"
		return intelBlocksFrom, intelYmmFrom, true
	}
	return math.MaxInt, math.MaxInt, false
}

// splitsByCPUID is splits512 from CPUID leaf 0's vendor words (EBX, ECX, EDX) and leaf 1's
// EAX: AMD family 0x19, whose AVX-512 members are Zen 4 (its earlier ones, Zen 3, have no
// AVX-512). Zen 5 (family 0x1a) has full 512-bit datapaths. Intel's AVX-512 CPUs take the
// avx512 path, tuned for them by avx512TuningByCPUID.
func splitsByCPUID(vendorB, vendorC, vendorD, leaf1A uint32) bool {
	if vendorB != 0x68747541 || vendorD != 0x69746e65 || vendorC != 0x444d4163 { // "AuthenticAMD"
		return false
	}
	family := leaf1A >> 8 & 0xf
	if family == 0xf {
		family += leaf1A >> 20 & 0xff
	}
	return family == 0x19
}
