package bench

import (
	"sync"

	"github.com/shmsteer/shmsteer/kernels"
	"github.com/shmsteer/shmsteer/kernels/ccompare"
)

var (
	wiringMu sync.Mutex
	wirings  []func(*Sources)
)

// RegisterSources adds fill to the hooks EngineSources applies, in registration order. A
// package that provides contenders (cmd/shmsteer's *bench*.go files) registers them from init,
// so a new figure needs no edit of the command's main.
func RegisterSources(fill func(*Sources)) {
	wiringMu.Lock()
	defer wiringMu.Unlock()
	wirings = append(wirings, fill)
}

// EngineSources returns the Sources whose engine side lives below cmd/shmsteer: the add kernel
// (kernels.AddRows, whichever path kernels selected), the gcc variants of the C comparison
// (kernels/ccompare, skipped with its reason when built without cgo) and the memory overhead,
// then applies every RegisterSources hook (the contenders that need processes or the steering
// engine).
func EngineSources() Sources {
	src := Sources{AddRows: kernels.AddRows, AddRowsC: ccompare.AddRowsVariantRepeat, CVariants: ccompare.Variants, Memory: memoryOverhead}
	wiringMu.Lock()
	defer wiringMu.Unlock()
	for _, fill := range wirings {
		fill(&src)
	}
	return src
}
