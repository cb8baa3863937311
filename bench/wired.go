package bench

import (
	"github.com/shmsteer/shmsteer/kernels"
	"github.com/shmsteer/shmsteer/kernels/ccompare"
)

// EngineSources returns the Sources whose engine side lives below cmd/shmsteer: the add kernel
// (kernels.AddRows, whichever path kernels selected), the C comparison (kernels/ccompare,
// skipped with its reason when built without cgo) and the memory figures. cmd/shmsteer starts
// from it and fills in the hooks that need processes (keys) or the steering engine (step).
func EngineSources() Sources {
	return Sources{AddRows: kernels.AddRows, AddRowsC: ccompare.AddRowsRepeat, Memory: memoryRatios}
}
