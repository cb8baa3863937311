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
