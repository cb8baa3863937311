//go:build amd64 && !purego

#include "textflag.h"

// All kernels are leaf, NOSPLIT and use unaligned loads/stores, so any
// element offset works. Register use: DI = dst/a cursor, SI = v/b cursor,
// CX = elements left in the current row. VZEROUPPER before RET avoids
// AVX/SSE transition penalties in the Go code that follows.

// ---------------------------------------------------------------- AVX-512

// func addRowsAVX512(h, v []float32, s float32)
// h[t] += s*v for each row t; d = len(v) > 0, len(h) % d == 0.
TEXT ·addRowsAVX512(SB), NOSPLIT, $0-52
	MOVQ h_base+0(FP), DI
	MOVQ h_len+8(FP), AX
	MOVQ v_base+24(FP), R10
	MOVQ v_len+32(FP), R9
	VBROADCASTSS s+48(FP), Z0
	JMP  addRowsAVX512Body<>(SB)

// addRowsAVX512Body is the AVX-512 add on registers: DI = h, AX = len(h), R10 = v,
// R9 = len(v) = d, Z0 = s in every lane. Reached by a jump from addRowsAVX512 and from
// addRowsEntry (AddRows), whose arguments sit elsewhere in their frames; it returns to
// their caller.
//
// One row at a time, gcc -O3 -march=native's own loop: per 64 bytes, a load of v, an FMA
// with h as its memory operand (h + s*v rounded once, as every path rounds it) and a store;
// the loop starts a 64-byte line. On the AMD Zen 5 this was measured on (full 512-bit
// datapaths; bench --only kernels.add.*, paired rounds against the best gcc variant), the
// "avx512split" body (blocks of four rows, 256-bit vectors in a single row: Zen 4's best) ran
// 1.27-1.45x gcc at 16 KiB of h, 1.52-1.55x at 256 KiB, 1.22-1.28x at 4 MiB and 1.38-1.41x
// at 64 MiB. Row by row with four 512-bit vectors per iteration ran 0.87-0.93x, 0.93-0.94x,
// 0.97-1.13x and 0.94-1.21x; eight, two, and one in gcc's form, unaligned, and a prefetch of
// h 1-2 KiB ahead ran alike (4 KiB ahead with PREFETCHT1 was slower at 4 MiB, 1.14x). The loop
// placement then mattered at 16 KiB, as it does for gcc's identical copies of the loop there
// (82-88 ns for one, 103-119 ns for the others, in the same runs): four vectors unaligned
// 96-101 ns, at a 64-byte line 96-98 ns, two at a line 98-100 ns; this loop at a line
// 85-86 ns, at 32 bytes past one 92-96 ns. From 4 MiB up the variants were alike within the
// rounds' spread.
//
// Which body runs is cur's tuning (impl.blocksFrom, impl.pairs: avx512Tuning): from
// cur.blocksFrom floats of h, blocks of four rows (the avx512split body); otherwise, with
// cur.pairs, one row at a time with two vectors per iteration (addRowsAVX512PairsBody).
// Both are Intel's; elsewhere this loop.
TEXT addRowsAVX512Body<>(SB), NOSPLIT, $0
	MOVQ ·cur+8(SB), R11
	CMPQ AX, R11
	JAE  a512_blocks
	MOVQ ·cur+24(SB), R11
	CMPQ AX, R11
	JAE  a512_ymm
	MOVBQZX ·cur+16(SB), R11
	TESTQ   R11, R11
	JNZ     a512_pairs

a512_row:
	CMPQ AX, R9
	JB   a512_done
	SUBQ R9, AX

	// 16 floats per iteration, indexed by a negative byte offset counting up to 0, so the
	// loop is one ADD+JNZ.
	MOVQ R9, CX
	SHRQ $4, CX
	SHLQ $6, CX
	ADDQ CX, DI
	LEAQ (R10)(CX*1), SI
	NEGQ CX
	JZ   a512_tail

	PCALIGN $64

a512_loop:
	VMOVUPS     (SI)(CX*1), Z1
	VFMADD213PS (DI)(CX*1), Z0, Z1
	VMOVUPS     Z1, (DI)(CX*1)
	ADDQ        $64, CX
	JNZ         a512_loop

a512_tail:
	// 0 <= d%16 < 16 elements left: K1 = (1<<CX)-1; masked-off lanes are neither read
	// (fault-suppressed) nor written.
	MOVQ        R9, CX
	ANDQ        $15, CX
	JZ          a512_row
	MOVL        $1, BX
	SHLL        CX, BX
	DECL        BX
	KMOVW       BX, K1
	VMOVUPS.Z   (DI), K1, Z1
	VMOVUPS.Z   (SI), K1, Z2
	VFMADD231PS Z2, Z0, Z1
	VMOVUPS     Z1, K1, (DI)
	LEAQ        (DI)(CX*4), DI
	JMP         a512_row

a512_done:
	VZEROUPPER
	RET

a512_blocks:
	JMP addRowsAVX512SplitBody<>(SB)

a512_pairs:
	JMP addRowsAVX512PairsBody<>(SB)

a512_ymm:
	JMP addRowsAVX2Body<>(SB) // Y0 is Z0's low half: s in every lane

// addRowsAVX512PairsBody is addRowsAVX512Body's loop with two vectors per iteration, on the
// same registers. On the Intel Xeon (family 6 model 0xcf) it was measured on it ran 0.94-1.01x
// the best gcc variant at 16 KiB of h where the one-vector loop ran 1.08-1.24x (four
// alternating pairs of bench --only kernels.add.16k, in the same runs), and alike at 256 KiB.
TEXT addRowsAVX512PairsBody<>(SB), NOSPLIT, $0
a512p_row:
	CMPQ AX, R9
	JB   a512p_done
	SUBQ R9, AX

	// CX = -(bytes of whole vectors) + 64: the loop takes the vectors at CX-64 and CX (from
	// the rows' ends) while CX < 0; it ends with CX = 64 (none left) or 0 (one, at -64).
	MOVQ R9, CX
	SHRQ $4, CX
	SHLQ $6, CX
	ADDQ CX, DI
	LEAQ (R10)(CX*1), SI
	NEGQ CX
	JZ   a512p_tail
	ADDQ $64, CX
	JNS  a512p_last

	PCALIGN $64

a512p_loop:
	VMOVUPS     -64(SI)(CX*1), Z1
	VMOVUPS     (SI)(CX*1), Z2
	VFMADD213PS -64(DI)(CX*1), Z0, Z1
	VFMADD213PS (DI)(CX*1), Z0, Z2
	VMOVUPS     Z1, -64(DI)(CX*1)
	VMOVUPS     Z2, (DI)(CX*1)
	ADDQ        $128, CX
	JS          a512p_loop
	CMPQ        CX, $64
	JEQ         a512p_tail

a512p_last:
	VMOVUPS     -64(SI), Z1
	VFMADD213PS -64(DI), Z0, Z1
	VMOVUPS     Z1, -64(DI)

a512p_tail:
	// As addRowsAVX512Body's tail.
	MOVQ        R9, CX
	ANDQ        $15, CX
	JZ          a512p_row
	MOVL        $1, BX
	SHLL        CX, BX
	DECL        BX
	KMOVW       BX, K1
	VMOVUPS.Z   (DI), K1, Z1
	VMOVUPS.Z   (SI), K1, Z2
	VFMADD231PS Z2, Z0, Z1
	VMOVUPS     Z1, K1, (DI)
	LEAQ        (DI)(CX*4), DI
	JMP         a512p_row

a512p_done:
	VZEROUPPER
	RET

// func addRowsAVX512Split(h, v []float32, s float32)
// addRowsAVX512 for the "avx512split" path: CPUs that execute a 512-bit operation as two
// 256-bit halves (AMD Zen 4), where blocks of four rows, and 256-bit vectors in a single row,
// measured faster than addRowsAVX512Body's loop.
TEXT ·addRowsAVX512Split(SB), NOSPLIT, $0-52
	MOVQ h_base+0(FP), DI
	MOVQ h_len+8(FP), AX
	MOVQ v_base+24(FP), R10
	MOVQ v_len+32(FP), R9
	VBROADCASTSS s+48(FP), Z0
	JMP  addRowsAVX512SplitBody<>(SB)

// addRowsAVX512SplitBody is the "avx512split" add on registers, as addRowsAVX512Body.
TEXT addRowsAVX512SplitBody<>(SB), NOSPLIT, $0
	// No software prefetch, as gcc's loop has none: timed by thread CPU time in rounds
	// paired with gcc's, prefetching h 2 KiB ahead gained nothing at 256 KiB and cost the
	// prefill step (256 KiB spans of a 4 MiB h) 3-5%, and 4 KiB ahead ran 1.06-1.44x gcc at
	// 4 and 64 MiB where the single-row loop ran 0.98-1.02x (an earlier, wall-clock
	// comparison on a quieter machine had favoured 2 KiB at 256 KiB by 1-2%).

	// Blocks of four rows: each vector of v is loaded once and added into the same
	// 32 floats of four rows (R8, R11, R13 are rows 2-4 of the block), so a block
	// reads v a quarter as often as four single rows do. Within an iteration every
	// load comes before every store: rows a multiple of 4 KiB apart (D = 4096) would
	// otherwise put a store and the next row's load at the same address bits 0-11, which
	// the CPU's memory disambiguation takes for a dependence. Each element still gets
	// one FMA, h + s*v rounded once: the same bits as the single-row loop. On the Zen 4
	// this was measured on (bench, paired rounds against gcc's one-row-at-a-time loop)
	// the blocks ran 0.82-0.86x gcc at 256 KiB of h, 0.86-0.94x at 4 MiB and 0.81-0.84x
	// at 64 MiB, where single rows ran 0.87-0.93x, 0.99-1.08x and 0.94-0.97x; 32 floats
	// (two 512-bit vectors) a row per iteration ran alike with one, and four 256-bit
	// vectors.
	MOVQ R9, BX
	SHLQ $2, BX  // BX = one row's bytes
	MOVQ R9, R12
	SHLQ $2, R12 // R12 = four rows' elements

a512s_blk:
	CMPQ AX, R12
	JB   a512s_row
	SUBQ R12, AX
	LEAQ (DI)(BX*1), R8
	LEAQ (R8)(BX*1), R11
	LEAQ (R11)(BX*1), R13
	MOVQ R9, CX
	SHRQ $5, CX
	SHLQ $7, CX
	ADDQ CX, DI
	ADDQ CX, R8
	ADDQ CX, R11
	ADDQ CX, R13
	LEAQ (R10)(CX*1), SI
	NEGQ CX
	JZ   a512s_blk_rest
	PCALIGN $64

a512s_blk_loop32:
	VMOVUPS     (SI)(CX*1), Z1
	VMOVUPS     64(SI)(CX*1), Z2
	VMOVUPS     (DI)(CX*1), Z3
	VMOVUPS     (R8)(CX*1), Z4
	VMOVUPS     (R11)(CX*1), Z5
	VMOVUPS     (R13)(CX*1), Z6
	VMOVUPS     64(DI)(CX*1), Z7
	VMOVUPS     64(R8)(CX*1), Z8
	VMOVUPS     64(R11)(CX*1), Z9
	VMOVUPS     64(R13)(CX*1), Z10
	VFMADD231PS Z1, Z0, Z3
	VFMADD231PS Z1, Z0, Z4
	VFMADD231PS Z1, Z0, Z5
	VFMADD231PS Z1, Z0, Z6
	VFMADD231PS Z2, Z0, Z7
	VFMADD231PS Z2, Z0, Z8
	VFMADD231PS Z2, Z0, Z9
	VFMADD231PS Z2, Z0, Z10
	VMOVUPS     Z3, (DI)(CX*1)
	VMOVUPS     Z4, (R8)(CX*1)
	VMOVUPS     Z5, (R11)(CX*1)
	VMOVUPS     Z6, (R13)(CX*1)
	VMOVUPS     Z7, 64(DI)(CX*1)
	VMOVUPS     Z8, 64(R8)(CX*1)
	VMOVUPS     Z9, 64(R11)(CX*1)
	VMOVUPS     Z10, 64(R13)(CX*1)
	ADDQ        $128, CX
	JNZ         a512s_blk_loop32

a512s_blk_rest:
	// 0-31 floats left in each row: one 16-float step, then a K-masked one.
	MOVQ        R9, CX
	ANDQ        $31, CX
	CMPQ        CX, $16
	JB          a512s_blk_tail
	VMOVUPS     (SI), Z1
	VMOVUPS     (DI), Z3
	VMOVUPS     (R8), Z4
	VMOVUPS     (R11), Z5
	VMOVUPS     (R13), Z6
	VFMADD231PS Z1, Z0, Z3
	VFMADD231PS Z1, Z0, Z4
	VFMADD231PS Z1, Z0, Z5
	VFMADD231PS Z1, Z0, Z6
	VMOVUPS     Z3, (DI)
	VMOVUPS     Z4, (R8)
	VMOVUPS     Z5, (R11)
	VMOVUPS     Z6, (R13)
	ADDQ        $64, SI
	ADDQ        $64, DI
	ADDQ        $64, R8
	ADDQ        $64, R11
	ADDQ        $64, R13
	SUBQ        $16, CX

a512s_blk_tail:
	TESTQ       CX, CX
	JZ          a512s_blk_next
	MOVL        $1, DX
	SHLL        CX, DX
	DECL        DX
	KMOVW       DX, K1
	VMOVUPS.Z   (SI), K1, Z1
	VMOVUPS.Z   (DI), K1, Z3
	VMOVUPS.Z   (R8), K1, Z4
	VMOVUPS.Z   (R11), K1, Z5
	VMOVUPS.Z   (R13), K1, Z6
	VFMADD231PS Z1, Z0, Z3
	VFMADD231PS Z1, Z0, Z4
	VFMADD231PS Z1, Z0, Z5
	VFMADD231PS Z1, Z0, Z6
	VMOVUPS     Z3, K1, (DI)
	VMOVUPS     Z4, K1, (R8)
	VMOVUPS     Z5, K1, (R11)
	VMOVUPS     Z6, K1, (R13)
	LEAQ        (R13)(CX*4), R13

a512s_blk_next:
	MOVQ R13, DI // the row after the block
	JMP  a512s_blk

a512s_row:
	CMPQ AX, R9
	JB   a512s_done
	SUBQ R9, AX

	// Unrolled part: 64 floats per iteration, indexed by a negative byte
	// offset counting up to 0 so the loop is one ADD+JNZ (~6% faster than
	// bumping two pointers at 16 KiB), in eight 256-bit vectors, each loaded,
	// fused and stored before the next: on the AMD Zen 4 this was measured on,
	// whose 512-bit operations are two 256-bit halves, that ran as fast as four
	// 512-bit vectors or faster at 16 and 256 KiB of h in most paired runs
	// against gcc (never clearly slower) and alike from 4 MiB up; the tail
	// keeps 512-bit vectors and the K-masked remainder. Same bits either way:
	// one FMA per element. Each vector of h is loaded into the register and v
	// is the FMA's memory operand (the 231 form): the same loop with v in the
	// register and h the memory operand (213) took 1.02-1.07x as long at 16 KiB
	// (231/213 time 0.937-0.985 with v 0, 64, 1024 or 3072 bytes past h
	// modulo 4 KiB, nine runs of 31 paired rounds in one process).
	MOVQ R9, CX
	SHRQ $6, CX
	SHLQ $8, CX
	ADDQ CX, DI
	LEAQ (R10)(CX*1), SI
	NEGQ CX
	JZ   a512s_rest
	// Not PCALIGNed: at 4 MiB (a harness, against gcc) this loop took 1.02-1.08x as long
	// where it fell as starting a 64-byte line, but single rows now matter at 16 KiB, where
	// the bench put it aligned at 1.05-1.15x gcc (median 1.085, six runs, load 5) and
	// unaligned at 1.03-1.10x (1.048; the old code 0.97-1.13x, 1.051) in the same runs.

a512s_loop64:
	VMOVUPS     (DI)(CX*1), Y1
	VFMADD231PS (SI)(CX*1), Y0, Y1
	VMOVUPS     Y1, (DI)(CX*1)
	VMOVUPS     32(DI)(CX*1), Y2
	VFMADD231PS 32(SI)(CX*1), Y0, Y2
	VMOVUPS     Y2, 32(DI)(CX*1)
	VMOVUPS     64(DI)(CX*1), Y3
	VFMADD231PS 64(SI)(CX*1), Y0, Y3
	VMOVUPS     Y3, 64(DI)(CX*1)
	VMOVUPS     96(DI)(CX*1), Y4
	VFMADD231PS 96(SI)(CX*1), Y0, Y4
	VMOVUPS     Y4, 96(DI)(CX*1)
	VMOVUPS     128(DI)(CX*1), Y5
	VFMADD231PS 128(SI)(CX*1), Y0, Y5
	VMOVUPS     Y5, 128(DI)(CX*1)
	VMOVUPS     160(DI)(CX*1), Y6
	VFMADD231PS 160(SI)(CX*1), Y0, Y6
	VMOVUPS     Y6, 160(DI)(CX*1)
	VMOVUPS     192(DI)(CX*1), Y7
	VFMADD231PS 192(SI)(CX*1), Y0, Y7
	VMOVUPS     Y7, 192(DI)(CX*1)
	VMOVUPS     224(DI)(CX*1), Y8
	VFMADD231PS 224(SI)(CX*1), Y0, Y8
	VMOVUPS     Y8, 224(DI)(CX*1)
	ADDQ        $256, CX
	JNZ         a512s_loop64

a512s_rest:
	MOVQ R9, CX
	ANDQ $63, CX

a512s_loop16:
	CMPQ        CX, $16
	JB          a512s_tail
	VMOVUPS     (DI), Z1
	VFMADD231PS (SI), Z0, Z1
	VMOVUPS     Z1, (DI)
	ADDQ        $64, SI
	ADDQ        $64, DI
	SUBQ        $16, CX
	JMP         a512s_loop16

a512s_tail:
	// 0 < CX < 16 elements: K1 = (1<<CX)-1; masked-off lanes are neither
	// read (fault-suppressed) nor written.
	TESTQ       CX, CX
	JZ          a512s_row
	MOVL        $1, BX
	SHLL        CX, BX
	DECL        BX
	KMOVW       BX, K1
	VMOVUPS.Z   (DI), K1, Z1
	VMOVUPS.Z   (SI), K1, Z2
	VFMADD231PS Z2, Z0, Z1
	VMOVUPS     Z1, K1, (DI)
	LEAQ        (DI)(CX*4), DI
	JMP         a512s_row

a512s_done:
	VZEROUPPER
	RET

// func dotAVX512(a, b []float32) float32
TEXT ·dotAVX512(SB), NOSPLIT, $0-52
	MOVQ   a_base+0(FP), DI
	MOVQ   a_len+8(FP), CX
	MOVQ   b_base+24(FP), SI
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4

d512_loop64:
	CMPQ        CX, $64
	JB          d512_loop16
	VMOVUPS     (DI), Z5
	VMOVUPS     64(DI), Z6
	VMOVUPS     128(DI), Z7
	VMOVUPS     192(DI), Z8
	VFMADD231PS (SI), Z5, Z1
	VFMADD231PS 64(SI), Z6, Z2
	VFMADD231PS 128(SI), Z7, Z3
	VFMADD231PS 192(SI), Z8, Z4
	ADDQ        $256, SI
	ADDQ        $256, DI
	SUBQ        $64, CX
	JMP         d512_loop64

d512_loop16:
	CMPQ        CX, $16
	JB          d512_tail
	VMOVUPS     (DI), Z5
	VFMADD231PS (SI), Z5, Z1
	ADDQ        $64, SI
	ADDQ        $64, DI
	SUBQ        $16, CX
	JMP         d512_loop16

d512_tail:
	TESTQ       CX, CX
	JZ          d512_reduce
	MOVL        $1, BX
	SHLL        CX, BX
	DECL        BX
	KMOVW       BX, K1
	VMOVUPS.Z   (DI), K1, Z5 // masked-off lanes load as 0 and add 0
	VMOVUPS.Z   (SI), K1, Z6
	VFMADD231PS Z6, Z5, Z1

d512_reduce:
	VADDPS        Z2, Z1, Z1
	VADDPS        Z4, Z3, Z3
	VADDPS        Z3, Z1, Z1
	VEXTRACTF64X4 $1, Z1, Y2 // AVX512F (the F32X8 form needs DQ)
	VADDPS        Y2, Y1, Y1
	VEXTRACTF128  $1, Y1, X2
	VADDPS        X2, X1, X1
	VMOVHLPS      X1, X1, X2
	VADDPS        X2, X1, X1
	VMOVSHDUP     X1, X2
	VADDSS        X2, X1, X1
	VMOVSS        X1, ret+48(FP)
	VZEROUPPER
	RET

// func sumSqAVX512(a []float32) float64
// Squares are widened to float64 before accumulating so |a| up to MaxFloat32
// cannot overflow the sum.
TEXT ·sumSqAVX512(SB), NOSPLIT, $0-32
	MOVQ   a_base+0(FP), SI
	MOVQ   a_len+8(FP), CX
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4

s512_loop32:
	CMPQ        CX, $32
	JB          s512_loop8
	VCVTPS2PD   (SI), Z5
	VCVTPS2PD   32(SI), Z6
	VCVTPS2PD   64(SI), Z7
	VCVTPS2PD   96(SI), Z8
	VFMADD231PD Z5, Z5, Z1
	VFMADD231PD Z6, Z6, Z2
	VFMADD231PD Z7, Z7, Z3
	VFMADD231PD Z8, Z8, Z4
	ADDQ        $128, SI
	SUBQ        $32, CX
	JMP         s512_loop32

s512_loop8:
	CMPQ        CX, $8
	JB          s512_reduce
	VCVTPS2PD   (SI), Z5
	VFMADD231PD Z5, Z5, Z1
	ADDQ        $32, SI
	SUBQ        $8, CX
	JMP         s512_loop8

s512_reduce:
	VADDPD        Z2, Z1, Z1
	VADDPD        Z4, Z3, Z3
	VADDPD        Z3, Z1, Z1
	VEXTRACTF64X4 $1, Z1, Y2
	VADDPD        Y2, Y1, Y1
	VEXTRACTF128  $1, Y1, X2
	VADDPD        X2, X1, X1
	VUNPCKHPD     X1, X1, X2
	VADDSD        X2, X1, X1

s512_tail:
	TESTQ       CX, CX
	JZ          s512_done
	VCVTSS2SD   (SI), X5, X5
	VFMADD231SD X5, X5, X1
	ADDQ        $4, SI
	DECQ        CX
	JMP         s512_tail

s512_done:
	VMOVSD X1, ret+24(FP)
	VZEROUPPER
	RET

// ---------------------------------------------------------------- AVX2

// func addRowsAVX2(h, v []float32, s float32)
TEXT ·addRowsAVX2(SB), NOSPLIT, $0-52
	MOVQ         h_base+0(FP), DI
	MOVQ         h_len+8(FP), AX
	MOVQ         v_base+24(FP), R10
	MOVQ         v_len+32(FP), R9
	VBROADCASTSS s+48(FP), Y0
	JMP          addRowsAVX2Body<>(SB)

// addRowsAVX2Body is the AVX2 add on registers, as addRowsAVX512Body (Y0 = s in every lane).
TEXT addRowsAVX2Body<>(SB), NOSPLIT, $0

	// Blocks of four rows, as in the AVX-512 add: 16 floats of v per iteration
	// loaded once and added into four rows, every load of an iteration before its
	// stores; then one 8-float step and a scalar tail in each of the four rows.
	MOVQ R9, BX
	SHLQ $2, BX  // BX = one row's bytes
	MOVQ R9, R12
	SHLQ $2, R12 // R12 = four rows' elements

a256_blk:
	CMPQ AX, R12
	JB   a256_row
	SUBQ R12, AX
	LEAQ (DI)(BX*1), R8
	LEAQ (R8)(BX*1), R11
	LEAQ (R11)(BX*1), R13
	MOVQ R9, CX
	SHRQ $4, CX
	SHLQ $6, CX
	ADDQ CX, DI
	ADDQ CX, R8
	ADDQ CX, R11
	ADDQ CX, R13
	LEAQ (R10)(CX*1), SI
	NEGQ CX
	JZ   a256_blk_rest
	PCALIGN $64

a256_blk_loop16:
	VMOVUPS     (SI)(CX*1), Y1
	VMOVUPS     32(SI)(CX*1), Y2
	VMOVUPS     (DI)(CX*1), Y3
	VMOVUPS     (R8)(CX*1), Y4
	VMOVUPS     (R11)(CX*1), Y5
	VMOVUPS     (R13)(CX*1), Y6
	VMOVUPS     32(DI)(CX*1), Y7
	VMOVUPS     32(R8)(CX*1), Y8
	VMOVUPS     32(R11)(CX*1), Y9
	VMOVUPS     32(R13)(CX*1), Y10
	VFMADD231PS Y1, Y0, Y3
	VFMADD231PS Y1, Y0, Y4
	VFMADD231PS Y1, Y0, Y5
	VFMADD231PS Y1, Y0, Y6
	VFMADD231PS Y2, Y0, Y7
	VFMADD231PS Y2, Y0, Y8
	VFMADD231PS Y2, Y0, Y9
	VFMADD231PS Y2, Y0, Y10
	VMOVUPS     Y3, (DI)(CX*1)
	VMOVUPS     Y4, (R8)(CX*1)
	VMOVUPS     Y5, (R11)(CX*1)
	VMOVUPS     Y6, (R13)(CX*1)
	VMOVUPS     Y7, 32(DI)(CX*1)
	VMOVUPS     Y8, 32(R8)(CX*1)
	VMOVUPS     Y9, 32(R11)(CX*1)
	VMOVUPS     Y10, 32(R13)(CX*1)
	ADDQ        $64, CX
	JNZ         a256_blk_loop16

a256_blk_rest:
	// 0-15 floats left in each row: one 8-float step, then scalars.
	MOVQ        R9, CX
	ANDQ        $15, CX
	CMPQ        CX, $8
	JB          a256_blk_tail
	VMOVUPS     (SI), Y1
	VMOVUPS     (DI), Y3
	VMOVUPS     (R8), Y4
	VMOVUPS     (R11), Y5
	VMOVUPS     (R13), Y6
	VFMADD231PS Y1, Y0, Y3
	VFMADD231PS Y1, Y0, Y4
	VFMADD231PS Y1, Y0, Y5
	VFMADD231PS Y1, Y0, Y6
	VMOVUPS     Y3, (DI)
	VMOVUPS     Y4, (R8)
	VMOVUPS     Y5, (R11)
	VMOVUPS     Y6, (R13)
	ADDQ        $32, SI
	ADDQ        $32, DI
	ADDQ        $32, R8
	ADDQ        $32, R11
	ADDQ        $32, R13
	SUBQ        $8, CX

a256_blk_tail:
	// Scalar tail (< 8 elements a row); X0[0] is s.
	TESTQ       CX, CX
	JZ          a256_blk_next
	VMOVSS      (SI), X1
	VMOVSS      (DI), X3
	VMOVSS      (R8), X4
	VMOVSS      (R11), X5
	VMOVSS      (R13), X6
	VFMADD231SS X1, X0, X3
	VFMADD231SS X1, X0, X4
	VFMADD231SS X1, X0, X5
	VFMADD231SS X1, X0, X6
	VMOVSS      X3, (DI)
	VMOVSS      X4, (R8)
	VMOVSS      X5, (R11)
	VMOVSS      X6, (R13)
	ADDQ        $4, SI
	ADDQ        $4, DI
	ADDQ        $4, R8
	ADDQ        $4, R11
	ADDQ        $4, R13
	DECQ        CX
	JMP         a256_blk_tail

a256_blk_next:
	MOVQ R13, DI // the row after the block
	JMP  a256_blk

a256_row:
	CMPQ AX, R9
	JB   a256_done
	SUBQ R9, AX

	// Unrolled part: 32 floats per iteration, negative index (see AVX-512).
	MOVQ R9, CX
	SHRQ $5, CX
	SHLQ $7, CX
	ADDQ CX, DI
	LEAQ (R10)(CX*1), SI
	NEGQ CX
	JZ   a256_rest

a256_loop32:
	VMOVUPS     (SI)(CX*1), Y1
	VMOVUPS     32(SI)(CX*1), Y2
	VMOVUPS     64(SI)(CX*1), Y3
	VMOVUPS     96(SI)(CX*1), Y4
	VFMADD213PS (DI)(CX*1), Y0, Y1
	VFMADD213PS 32(DI)(CX*1), Y0, Y2
	VFMADD213PS 64(DI)(CX*1), Y0, Y3
	VFMADD213PS 96(DI)(CX*1), Y0, Y4
	VMOVUPS     Y1, (DI)(CX*1)
	VMOVUPS     Y2, 32(DI)(CX*1)
	VMOVUPS     Y3, 64(DI)(CX*1)
	VMOVUPS     Y4, 96(DI)(CX*1)
	ADDQ        $128, CX
	JNZ         a256_loop32


a256_rest:
	MOVQ R9, CX
	ANDQ $31, CX

a256_loop8:
	CMPQ        CX, $8
	JB          a256_tail
	VMOVUPS     (DI), Y1
	VFMADD231PS (SI), Y0, Y1
	VMOVUPS     Y1, (DI)
	ADDQ        $32, SI
	ADDQ        $32, DI
	SUBQ        $8, CX
	JMP         a256_loop8

a256_tail:
	// Scalar tail (< 8 elements); X0[0] is s.
	TESTQ       CX, CX
	JZ          a256_row
	VMOVSS      (DI), X1
	VFMADD231SS (SI), X0, X1
	VMOVSS      X1, (DI)
	ADDQ        $4, SI
	ADDQ        $4, DI
	DECQ        CX
	JMP         a256_tail

a256_done:
	VZEROUPPER
	RET

// func dotAVX2(a, b []float32) float32
TEXT ·dotAVX2(SB), NOSPLIT, $0-52
	MOVQ   a_base+0(FP), DI
	MOVQ   a_len+8(FP), CX
	MOVQ   b_base+24(FP), SI
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4

d256_loop32:
	CMPQ        CX, $32
	JB          d256_loop8
	VMOVUPS     (DI), Y5
	VMOVUPS     32(DI), Y6
	VMOVUPS     64(DI), Y7
	VMOVUPS     96(DI), Y8
	VFMADD231PS (SI), Y5, Y1
	VFMADD231PS 32(SI), Y6, Y2
	VFMADD231PS 64(SI), Y7, Y3
	VFMADD231PS 96(SI), Y8, Y4
	ADDQ        $128, SI
	ADDQ        $128, DI
	SUBQ        $32, CX
	JMP         d256_loop32

d256_loop8:
	CMPQ        CX, $8
	JB          d256_reduce
	VMOVUPS     (DI), Y5
	VFMADD231PS (SI), Y5, Y1
	ADDQ        $32, SI
	ADDQ        $32, DI
	SUBQ        $8, CX
	JMP         d256_loop8

d256_reduce:
	VADDPS       Y2, Y1, Y1
	VADDPS       Y4, Y3, Y3
	VADDPS       Y3, Y1, Y1
	VEXTRACTF128 $1, Y1, X2
	VADDPS       X2, X1, X1
	VMOVHLPS     X1, X1, X2
	VADDPS       X2, X1, X1
	VMOVSHDUP    X1, X2
	VADDSS       X2, X1, X1

d256_tail:
	TESTQ       CX, CX
	JZ          d256_done
	VMOVSS      (DI), X5
	VFMADD231SS (SI), X5, X1
	ADDQ        $4, SI
	ADDQ        $4, DI
	DECQ        CX
	JMP         d256_tail

d256_done:
	VMOVSS X1, ret+48(FP)
	VZEROUPPER
	RET

// func sumSqAVX2(a []float32) float64
TEXT ·sumSqAVX2(SB), NOSPLIT, $0-32
	MOVQ   a_base+0(FP), SI
	MOVQ   a_len+8(FP), CX
	VXORPD Y1, Y1, Y1
	VXORPD Y2, Y2, Y2
	VXORPD Y3, Y3, Y3
	VXORPD Y4, Y4, Y4

s256_loop16:
	CMPQ        CX, $16
	JB          s256_loop4
	VCVTPS2PD   (SI), Y5
	VCVTPS2PD   16(SI), Y6
	VCVTPS2PD   32(SI), Y7
	VCVTPS2PD   48(SI), Y8
	VFMADD231PD Y5, Y5, Y1
	VFMADD231PD Y6, Y6, Y2
	VFMADD231PD Y7, Y7, Y3
	VFMADD231PD Y8, Y8, Y4
	ADDQ        $64, SI
	SUBQ        $16, CX
	JMP         s256_loop16

s256_loop4:
	CMPQ        CX, $4
	JB          s256_reduce
	VCVTPS2PD   (SI), Y5
	VFMADD231PD Y5, Y5, Y1
	ADDQ        $16, SI
	SUBQ        $4, CX
	JMP         s256_loop4

s256_reduce:
	VADDPD       Y2, Y1, Y1
	VADDPD       Y4, Y3, Y3
	VADDPD       Y3, Y1, Y1
	VEXTRACTF128 $1, Y1, X2
	VADDPD       X2, X1, X1
	VUNPCKHPD    X1, X1, X2
	VADDSD       X2, X1, X1

s256_tail:
	TESTQ       CX, CX
	JZ          s256_done
	VCVTSS2SD   (SI), X5, X5
	VFMADD231SD X5, X5, X1
	ADDQ        $4, SI
	DECQ        CX
	JMP         s256_tail

s256_done:
	VMOVSD X1, ret+24(FP)
	VZEROUPPER
	RET

// ---------------------------------------------------------------- dispatch

// func addRowsEntry(h []float32, d int, s float32, v []float32)
// AddRows's body: checks the shape (d > 0, len(v) == d, len(h) a multiple of d) and jumps
// into the path in use with no further call, so a Go caller's AddRows is one direct call.
// Anything else, a bad shape (which panics there) or the generic path, is addRowsSlow's, by
// a tail jump with the same arguments in the same frame. The path is cur.id, cur's first
// word (TestCurIDFirst).
TEXT ·addRowsEntry(SB), NOSPLIT, $0-64
	MOVQ  h_len+8(FP), AX
	MOVQ  d+24(FP), R9
	MOVQ  v_len+48(FP), CX
	TESTQ R9, R9
	JLE   entry_slow
	CMPQ  CX, R9
	JNE   entry_slow
	CMPQ  AX, R9
	JEQ   entry_path // one row (a decode step): no division
	XORL  DX, DX
	DIVQ  R9
	TESTQ DX, DX
	JNZ   entry_slow
	MOVQ  h_len+8(FP), AX

entry_path:
	MOVQ ·cur+0(SB), DX
	MOVQ h_base+0(FP), DI
	MOVQ v_base+40(FP), R10
	CMPQ DX, $2 // idAVX512
	JNE  entry_split
	VBROADCASTSS s+32(FP), Z0
	JMP  addRowsAVX512Body<>(SB)

entry_split:
	CMPQ DX, $3 // idAVX512Split
	JNE  entry_avx2
	VBROADCASTSS s+32(FP), Z0
	JMP  addRowsAVX512SplitBody<>(SB)

entry_avx2:
	CMPQ DX, $1 // idAVX2
	JNE  entry_slow
	VBROADCASTSS s+32(FP), Y0
	JMP  addRowsAVX2Body<>(SB)

entry_slow:
	JMP ·addRowsSlow(SB)

// func addRowsSIMD(h, v []float32, s float32, path int)
// Single entry point for the hot add so the exported Go wrapper makes one
// direct call (no ABI wrapper, no func value) and keeps nothing across it:
// path is idAVX512, idAVX512Split or idAVX2 (the wrapper runs the generic path itself).
TEXT ·addRowsSIMD(SB), NOSPLIT, $0-64
	MOVQ path+56(FP), AX
	CMPQ AX, $2 // idAVX512
	JNE  simd_split
	JMP  ·addRowsAVX512(SB) // tail call: same argument layout

simd_split:
	CMPQ AX, $3 // idAVX512Split
	JNE  simd_avx2
	JMP  ·addRowsAVX512Split(SB)

simd_avx2:
	JMP ·addRowsAVX2(SB)

// ---------------------------------------------------------------- two sources

// func addRows2SIMD(h, x, y []float32, a, b float32, path int) bool
// The fused two-source add's entry point, as addRowsSIMD.
TEXT ·addRows2SIMD(SB), NOSPLIT, $0-89
	MOVQ path+80(FP), AX
	CMPQ AX, $2 // idAVX512
	JEQ  simd2_avx512
	CMPQ AX, $3 // idAVX512Split: the fused add has one AVX-512 body
	JEQ  simd2_avx512
	CMPQ AX, $1 // idAVX2
	JEQ  simd2_avx2
	MOVB $0, ret+88(FP)
	RET

simd2_avx512:
	MOVB $1, ret+88(FP)
	JMP  ·addRows2AVX512(SB)

simd2_avx2:
	MOVB $1, ret+88(FP)
	JMP  ·addRows2AVX2(SB)

// func addRows2AVX512(h, x, y []float32, a, b float32)
// h[t] = h[t] + (a*x + b*y) for each row t: the sum of the sources rounded once (a product,
// then an FMA), then added to h; d = len(x) = len(y) > 0, len(h) % d == 0.
// Registers: DI h, SI x, DX y (cursors; the unrolled loop indexes back from their ends with
// the negative CX, as addRowsAVX512), R10 x base, R12 y base, R9 d, AX floats of h left.
TEXT ·addRows2AVX512(SB), NOSPLIT, $0-80
	MOVQ         h_base+0(FP), DI
	MOVQ         h_len+8(FP), AX
	MOVQ         x_base+24(FP), R10
	MOVQ         x_len+32(FP), R9
	MOVQ         y_base+48(FP), R12
	VBROADCASTSS a+72(FP), Z0
	VBROADCASTSS b+76(FP), Z5

b512_row:
	CMPQ AX, R9
	JB   b512_done
	SUBQ R9, AX

	MOVQ R9, CX
	SHRQ $6, CX
	SHLQ $8, CX
	ADDQ CX, DI
	LEAQ (R10)(CX*1), SI
	LEAQ (R12)(CX*1), DX
	NEGQ CX
	JZ   b512_rest

b512_loop:
	VMULPS      (SI)(CX*1), Z0, Z1
	VFMADD231PS (DX)(CX*1), Z5, Z1
	VADDPS      (DI)(CX*1), Z1, Z1
	VMOVUPS     Z1, (DI)(CX*1)
	VMULPS      64(SI)(CX*1), Z0, Z2
	VFMADD231PS 64(DX)(CX*1), Z5, Z2
	VADDPS      64(DI)(CX*1), Z2, Z2
	VMOVUPS     Z2, 64(DI)(CX*1)
	VMULPS      128(SI)(CX*1), Z0, Z3
	VFMADD231PS 128(DX)(CX*1), Z5, Z3
	VADDPS      128(DI)(CX*1), Z3, Z3
	VMOVUPS     Z3, 128(DI)(CX*1)
	VMULPS      192(SI)(CX*1), Z0, Z4
	VFMADD231PS 192(DX)(CX*1), Z5, Z4
	VADDPS      192(DI)(CX*1), Z4, Z4
	VMOVUPS     Z4, 192(DI)(CX*1)
	ADDQ        $256, CX
	JNZ         b512_loop

b512_rest:
	MOVQ R9, CX
	ANDQ $63, CX

b512_loop1:
	CMPQ        CX, $16
	JB          b512_tail
	VMULPS      (SI), Z0, Z1
	VFMADD231PS (DX), Z5, Z1
	VADDPS      (DI), Z1, Z1
	VMOVUPS     Z1, (DI)
	ADDQ        $64, SI
	ADDQ        $64, DX
	ADDQ        $64, DI
	SUBQ        $16, CX
	JMP         b512_loop1

b512_tail:
	// 0 < CX < 16 elements under the mask K1 = (1<<CX)-1, as addRowsAVX512.
	TESTQ       CX, CX
	JZ          b512_row
	MOVL        $1, BX
	SHLL        CX, BX
	DECL        BX
	KMOVW       BX, K1
	VMOVUPS.Z   (SI), K1, Z1
	VMOVUPS.Z   (DX), K1, Z2
	VMULPS      Z1, Z0, Z1
	VFMADD231PS Z2, Z5, Z1
	VMOVUPS.Z   (DI), K1, Z3
	VADDPS      Z3, Z1, Z1
	VMOVUPS     Z1, K1, (DI)
	LEAQ        (DI)(CX*4), DI
	JMP         b512_row

b512_done:
	VZEROUPPER
	RET

// func addRows2AVX2(h, x, y []float32, a, b float32)
// As addRows2AVX512 with 256-bit vectors and a scalar tail.
TEXT ·addRows2AVX2(SB), NOSPLIT, $0-80
	MOVQ         h_base+0(FP), DI
	MOVQ         h_len+8(FP), AX
	MOVQ         x_base+24(FP), R10
	MOVQ         x_len+32(FP), R9
	MOVQ         y_base+48(FP), R12
	VBROADCASTSS a+72(FP), Y0
	VBROADCASTSS b+76(FP), Y5

b256_row:
	CMPQ AX, R9
	JB   b256_done
	SUBQ R9, AX

	MOVQ R9, CX
	SHRQ $5, CX
	SHLQ $7, CX
	ADDQ CX, DI
	LEAQ (R10)(CX*1), SI
	LEAQ (R12)(CX*1), DX
	NEGQ CX
	JZ   b256_rest

b256_loop:
	VMULPS      (SI)(CX*1), Y0, Y1
	VFMADD231PS (DX)(CX*1), Y5, Y1
	VADDPS      (DI)(CX*1), Y1, Y1
	VMOVUPS     Y1, (DI)(CX*1)
	VMULPS      32(SI)(CX*1), Y0, Y2
	VFMADD231PS 32(DX)(CX*1), Y5, Y2
	VADDPS      32(DI)(CX*1), Y2, Y2
	VMOVUPS     Y2, 32(DI)(CX*1)
	VMULPS      64(SI)(CX*1), Y0, Y3
	VFMADD231PS 64(DX)(CX*1), Y5, Y3
	VADDPS      64(DI)(CX*1), Y3, Y3
	VMOVUPS     Y3, 64(DI)(CX*1)
	VMULPS      96(SI)(CX*1), Y0, Y4
	VFMADD231PS 96(DX)(CX*1), Y5, Y4
	VADDPS      96(DI)(CX*1), Y4, Y4
	VMOVUPS     Y4, 96(DI)(CX*1)
	ADDQ        $128, CX
	JNZ         b256_loop

b256_rest:
	MOVQ R9, CX
	ANDQ $31, CX

b256_loop1:
	CMPQ        CX, $8
	JB          b256_tail
	VMULPS      (SI), Y0, Y1
	VFMADD231PS (DX), Y5, Y1
	VADDPS      (DI), Y1, Y1
	VMOVUPS     Y1, (DI)
	ADDQ        $32, SI
	ADDQ        $32, DX
	ADDQ        $32, DI
	SUBQ        $8, CX
	JMP         b256_loop1

b256_tail:
	// Scalar tail (< 8 elements); X0[0] is a, X5[0] is b.
	TESTQ       CX, CX
	JZ          b256_row
	VMULSS      (SI), X0, X1
	VFMADD231SS (DX), X5, X1
	VADDSS      (DI), X1, X1
	VMOVSS      X1, (DI)
	ADDQ        $4, SI
	ADDQ        $4, DX
	ADDQ        $4, DI
	DECQ        CX
	JMP         b256_tail

b256_done:
	VZEROUPPER
	RET

// func cpuid(leaf uint32) (a, b, c, d uint32)
TEXT ·cpuid(SB), NOSPLIT, $0-24
	MOVL leaf+0(FP), AX
	XORL CX, CX
	CPUID
	MOVL AX, a+8(FP)
	MOVL BX, b+12(FP)
	MOVL CX, c+16(FP)
	MOVL DX, d+20(FP)
	RET
