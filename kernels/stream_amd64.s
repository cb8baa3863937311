//go:build amd64 && !purego

#include "textflag.h"

// func streamCopy64(dst, src unsafe.Pointer, n int)
// dst 64-byte aligned, n a positive multiple of 64: one cache line per iteration, loaded
// unaligned and stored non-temporally (write-combined, no read for ownership); the caller
// fences (storeFence) before publishing them.
TEXT ·streamCopy64(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
stream_loop:
	MOVOU 0(SI), X0
	MOVOU 16(SI), X1
	MOVOU 32(SI), X2
	MOVOU 48(SI), X3
	MOVNTO X0, 0(DI)
	MOVNTO X1, 16(DI)
	MOVNTO X2, 32(DI)
	MOVNTO X3, 48(DI)
	ADDQ $64, SI
	ADDQ $64, DI
	SUBQ $64, CX
	JNZ stream_loop
	RET

// func storeFence()
TEXT ·storeFence(SB), NOSPLIT, $0-0
	SFENCE
	RET

// func prefetch(p *byte)
TEXT ·prefetch(SB), NOSPLIT, $0-8
	MOVQ p+0(FP), AX
	PREFETCHT0 (AX)
	RET
