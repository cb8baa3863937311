//go:build amd64 && !purego

#include "textflag.h"

// func sumAddRowAVX2(h, dst, x, y []float32, a, b float32)
//
// dst = a*x + b*y and h += dst, in one pass (len(h) == len(dst) == len(x) == len(y) > 0): the
// sum formed as sum2AVX2 forms it (VMULPS a*x, then VFMADD231PS b*y) and added as addRowsAVX2
// adds with s = 1 (one rounding of h + sum). Y15 (X15: Go's zero register) is left alone.
TEXT ·sumAddRowAVX2(SB), NOSPLIT, $0-104
	MOVQ         h_base+0(FP), DI
	MOVQ         h_len+8(FP), R9
	MOVQ         dst_base+24(FP), R8
	MOVQ         x_base+48(FP), SI
	MOVQ         y_base+72(FP), DX
	VBROADCASTSS a+96(FP), Y0
	VBROADCASTSS b+100(FP), Y1
	MOVQ         R9, CX
	SHRQ         $5, CX           // blocks of 32 floats
	JZ           sar_rest

sar_block:
	VMULPS      (SI), Y0, Y2
	VMULPS      32(SI), Y0, Y3
	VMULPS      64(SI), Y0, Y4
	VMULPS      96(SI), Y0, Y5
	VFMADD231PS (DX), Y1, Y2
	VFMADD231PS 32(DX), Y1, Y3
	VFMADD231PS 64(DX), Y1, Y4
	VFMADD231PS 96(DX), Y1, Y5
	VMOVUPS     Y2, (R8)
	VMOVUPS     Y3, 32(R8)
	VMOVUPS     Y4, 64(R8)
	VMOVUPS     Y5, 96(R8)
	VADDPS      (DI), Y2, Y2
	VADDPS      32(DI), Y3, Y3
	VADDPS      64(DI), Y4, Y4
	VADDPS      96(DI), Y5, Y5
	VMOVUPS     Y2, (DI)
	VMOVUPS     Y3, 32(DI)
	VMOVUPS     Y4, 64(DI)
	VMOVUPS     Y5, 96(DI)
	ADDQ        $128, SI
	ADDQ        $128, DX
	ADDQ        $128, R8
	ADDQ        $128, DI
	DECQ        CX
	JNZ         sar_block

sar_rest:
	MOVQ R9, CX
	ANDQ $31, CX

sar_loop8:
	CMPQ        CX, $8
	JB          sar_tail
	VMULPS      (SI), Y0, Y2
	VFMADD231PS (DX), Y1, Y2
	VMOVUPS     Y2, (R8)
	VADDPS      (DI), Y2, Y2
	VMOVUPS     Y2, (DI)
	ADDQ        $32, SI
	ADDQ        $32, DX
	ADDQ        $32, R8
	ADDQ        $32, DI
	SUBQ        $8, CX
	JMP         sar_loop8

sar_tail:
	// Scalar tail (< 8 floats); X0[0] is a, X1[0] is b.
	TESTQ       CX, CX
	JZ          sar_done
	VMULSS      (SI), X0, X2
	VFMADD231SS (DX), X1, X2
	VMOVSS      X2, (R8)
	VADDSS      (DI), X2, X2
	VMOVSS      X2, (DI)
	ADDQ        $4, SI
	ADDQ        $4, DX
	ADDQ        $4, R8
	ADDQ        $4, DI
	DECQ        CX
	JMP         sar_tail

sar_done:
	VZEROUPPER
	RET

// func sumAddRowAVX512(h, dst, x, y []float32, a, b float32)
//
// sumAddRowAVX2 with 512-bit vectors and a K-masked tail, for the "avx512" path (full-width
// 512-bit datapaths): the same sum and the same rounding, lane by lane.
TEXT ·sumAddRowAVX512(SB), NOSPLIT, $0-104
	MOVQ         h_base+0(FP), DI
	MOVQ         h_len+8(FP), R9
	MOVQ         dst_base+24(FP), R8
	MOVQ         x_base+48(FP), SI
	MOVQ         y_base+72(FP), DX
	VBROADCASTSS a+96(FP), Z0
	VBROADCASTSS b+100(FP), Z1
	MOVQ         R9, CX
	SHRQ         $6, CX           // blocks of 64 floats
	JZ           sar5_rest

sar5_block:
	VMULPS      (SI), Z0, Z2
	VMULPS      64(SI), Z0, Z3
	VMULPS      128(SI), Z0, Z4
	VMULPS      192(SI), Z0, Z5
	VFMADD231PS (DX), Z1, Z2
	VFMADD231PS 64(DX), Z1, Z3
	VFMADD231PS 128(DX), Z1, Z4
	VFMADD231PS 192(DX), Z1, Z5
	VMOVUPS     Z2, (R8)
	VMOVUPS     Z3, 64(R8)
	VMOVUPS     Z4, 128(R8)
	VMOVUPS     Z5, 192(R8)
	VADDPS      (DI), Z2, Z2
	VADDPS      64(DI), Z3, Z3
	VADDPS      128(DI), Z4, Z4
	VADDPS      192(DI), Z5, Z5
	VMOVUPS     Z2, (DI)
	VMOVUPS     Z3, 64(DI)
	VMOVUPS     Z4, 128(DI)
	VMOVUPS     Z5, 192(DI)
	ADDQ        $256, SI
	ADDQ        $256, DX
	ADDQ        $256, R8
	ADDQ        $256, DI
	DECQ        CX
	JNZ         sar5_block

sar5_rest:
	MOVQ R9, CX
	ANDQ $63, CX

sar5_loop16:
	CMPQ        CX, $16
	JB          sar5_tail
	VMULPS      (SI), Z0, Z2
	VFMADD231PS (DX), Z1, Z2
	VMOVUPS     Z2, (R8)
	VADDPS      (DI), Z2, Z2
	VMOVUPS     Z2, (DI)
	ADDQ        $64, SI
	ADDQ        $64, DX
	ADDQ        $64, R8
	ADDQ        $64, DI
	SUBQ        $16, CX
	JMP         sar5_loop16

sar5_tail:
	// 0 < CX < 16 floats under the mask K1 = (1<<CX)-1: masked-off lanes are neither read
	// (fault-suppressed) nor written.
	TESTQ       CX, CX
	JZ          sar5_done
	MOVL        $1, BX
	SHLL        CX, BX
	DECL        BX
	KMOVW       BX, K1
	VMOVUPS.Z   (SI), K1, Z2
	VMOVUPS.Z   (DX), K1, Z3
	VMULPS      Z2, Z0, Z2
	VFMADD231PS Z3, Z1, Z2
	VMOVUPS     Z2, K1, (R8)
	VMOVUPS.Z   (DI), K1, Z3
	VADDPS      Z3, Z2, Z2
	VMOVUPS     Z2, K1, (DI)

sar5_done:
	VZEROUPPER
	RET
