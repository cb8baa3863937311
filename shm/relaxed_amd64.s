#include "textflag.h"

// func storeRelaxed(p *uint64, v uint64)
// An aligned 8-byte MOV: atomic, and on amd64 (TSO) ordered after every earlier load and store
// of this thread, but without the full fence of XCHG that sync/atomic's Store uses.
TEXT ·storeRelaxed(SB), NOSPLIT, $0-16
	MOVQ p+0(FP), AX
	MOVQ v+8(FP), BX
	MOVQ BX, (AX)
	RET
