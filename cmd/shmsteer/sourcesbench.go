package main

import "github.com/shmsteer/shmsteer/bench"

// The hooks of issue 13's figures, registered with the bench so that main's benchSources (which
// fills the older hooks) needs no change: bench.EngineSources applies them.
func init() {
	bench.RegisterSources(func(src *bench.Sources) {
		src.KeysGetCold = keysGetCold
		src.KeysReaderProcs = keyReaderProcs
		src.StepDecodeMixed, src.StepDecodeKernel = decodeMixed(false), decodeKernel(false)
		src.StepDecodeSparse, src.StepSparseKernel = decodeMixed(true), decodeKernel(true)
		src.TP8 = tp8Ratio
	})
}
