package kernels_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/kernels"
)

// TestAddRowsPrefetchRegimes runs the one- and two-source row adds on blocks either side of
// 64 KiB and 1 MiB of h (the SIMD loops once prefetched h in between, and may again), at
// unaligned starts, on every path: the same result as the reference (one source) and bit for
// bit Sum2 then AddRows (two sources).
func TestAddRowsPrefetchRegimes(t *testing.T) {
	const d = 1024 // 4 KiB rows: 16 rows are 64 KiB, 256 rows 1 MiB
	forEachPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(61, 62))
		for _, rows := range []int{15, 16, 17, 255, 256, 257} {
			off := 1 + r.IntN(15)
			s := scales[r.IntN(len(scales))]
			h0 := randVals(r, rows*d, 1e30)
			v0 := randVals(r, d, 1e30)
			h, bh := offsetCopy(h0, off)
			v, _ := offsetCopy(v0, 16-off)
			kernels.AddRows(h, d, s, v)
			checkUpdate(t, h, h0, s, func(i int) float32 { return v0[i%d] })
			requireGuards(t, bh, off, len(h0))

			a, b := scales[r.IntN(len(scales))], scales[r.IntN(len(scales))]
			x, _ := offsetCopy(randVals(r, d, 1e30), r.IntN(16))
			y, _ := offsetCopy(randVals(r, d, 1e30), r.IntN(16))
			h2, bh2 := offsetCopy(h0, off)
			want := viaSum2(h2, d, a, x, b, y)
			kernels.AddRows2(h2, d, a, x, b, y)
			require.Equal(t, bits(want), bits(h2), "rows=%d: not Sum2 then AddRows bit for bit", rows)
			requireGuards(t, bh2, off, len(h0))
		}
	})
}
