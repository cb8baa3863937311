//go:build amd64 && !purego

#include "textflag.h"

// func streamCopy64(dst, src unsafe.Pointer, n int)
// dst 64-byte aligned, n a positive multiple of 64: one cache line per iteration, loaded
// unaligned and stored non-temporally (write-combined, no read for ownership), then SFENCE so
// the lines are globally visible before any later store.
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
	SFENCE
	RET
