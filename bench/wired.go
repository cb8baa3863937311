package bench

import (
	"fmt"
	"time"

	"github.com/shmsteer/shmsteer/kernels"
	"github.com/shmsteer/shmsteer/kernels/ccompare"
)

// EngineSources returns the Sources whose engine side exists today: the add
// kernel (kernels.AddRows, whichever path kernels selected) and the C
// comparison (kernels/ccompare, skipped with its reason when built without
// cgo). cmd/shmsteer starts from it and fills in the keys, step and memory
// hooks.
func EngineSources() Sources {
	return Sources{AddRows: kernels.AddRows, KernelsC: cKernels}
}

// cKernels runs ccompare's own interleaved loop, which repeats the C add
// inside one cgo call so the cgo transition (~50 ns, 5% of the 16k add) is
// not charged to C; that fairness is why C is not an alternated contender
// here.
func cKernels(rounds int, minBatch time.Duration) (map[string]float64, error) {
	rs, err := ccompare.Run(rounds, minBatch)
	if err != nil {
		return nil, fmt.Errorf("kernels/ccompare: %w", err)
	}
	out := make(map[string]float64, len(rs))
	for _, r := range rs {
		out[r.Size] = r.CNs
	}
	return out, nil
}
