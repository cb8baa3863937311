package bench

import (
	"github.com/shmsteer/shmsteer/internal/ccompare"
	"github.com/shmsteer/shmsteer/kernels"
)

// engineSources are the shmsteer contenders: the add kernel (kernels.AddRows, whichever path
// kernels selected), the gcc variants of the C comparison (internal/ccompare, skipped with its
// reason when built without cgo), keys read and written by attached child processes
// (keysbench.go), the owner's Set, the steering steps (stepbench.go, decodebench.go) and the
// memory figures (memory.go, tp8bench.go).
func engineSources() sources {
	return sources{
		KeysGet:               keysChildSetup("get"),
		KeysGetCold:           keysGetCold,
		KeysSetClient:         keysChildSetup("set"),
		KeysSetOwner:          keysSetOwner,
		KeysReaderProcs:       keyReaderProcs,
		AddRows:               addRowsRepeat,
		AddRowsC:              ccompare.AddRowsVariantRepeat,
		CVariants:             ccompare.Variants,
		StepMixed:             stepMixed,
		StepKernel:            stepKernel,
		StepDecodeMixed:       decodeMixed(false, true),
		StepDecodeKernel:      decodeKernel(false),
		StepDecodeSparse:      decodeMixed(true, true),
		StepSparseKernel:      decodeKernel(true),
		StepDecodeMixedApply:  decodeMixed(false, false),
		StepDecodeSparseApply: decodeMixed(true, false),
		StepDecodeScattered:   decodeKernelScattered,
		Memory:                memoryOverhead,
		TP8:                   tp8Ratio,
	}
}

// addRowsRepeat is the engine's add contender: kernels.AddRows called iters times, directly,
// as a Go caller (the steering step) calls it, and as internal/ccompare calls each gcc variant
// from its C loop. The call inlines to the kernels' entry point.
func addRowsRepeat(h []float32, d int, s float32, v []float32, iters int) {
	for range iters {
		kernels.AddRows(h, d, s, v)
	}
}
