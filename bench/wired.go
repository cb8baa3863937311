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
		KeysGet:             keysChildSetup("get"),
		KeysGetCold:         keysGetCold,
		KeysSetClient:       keysChildSetup("set"),
		KeysSetOwner:        keysSetOwner,
		KeysReaderProcs:     keyReaderProcs,
		AddRows:             kernels.AddRows,
		AddRowsC:            ccompare.AddRowsVariantRepeat,
		CVariants:           ccompare.Variants,
		StepMixed:           stepMixed,
		StepKernel:          stepKernel,
		StepDecodeMixed:     decodeMixed(false),
		StepDecodeKernel:    decodeKernel(false),
		StepDecodeSparse:    decodeMixed(true),
		StepSparseKernel:    decodeKernel(true),
		StepDecodeScattered: decodeKernelScattered,
		Memory:              memoryOverhead,
		TP8:                 tp8Ratio,
	}
}
