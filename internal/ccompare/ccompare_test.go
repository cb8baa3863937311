package ccompare_test

import (
	"fmt"
	"math"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/internal/ccompare"
	"github.com/shmsteer/shmsteer/kernels"
)

func TestCMatchesKernels(t *testing.T) {
	if !ccompare.Available() {
		_, err := ccompare.Run(1, time.Millisecond)
		require.ErrorIs(t, err, ccompare.ErrUnavailable)
		t.Skip("built without cgo")
	}
	const d, rows = 4099, 3
	h := make([]float32, rows*d)
	v := make([]float32, d)
	for i := range h {
		h[i] = float32(math.Sin(float64(i)))
	}
	for i := range v {
		v[i] = float32(math.Cos(float64(i)))
	}
	a := append([]float32(nil), h...)
	ccompare.AddRows(h, d, 0.37, v)
	kernels.AddRows(a, d, 0.37, v)
	for i := range h {
		want := float64(a[i])
		require.InDelta(t, want, float64(h[i]), 3e-7*(math.Abs(want)+1), "i=%d", i)
	}
}

func TestRunSmoke(t *testing.T) {
	if !ccompare.Available() {
		t.Skip("built without cgo")
	}
	rs, err := ccompare.RunSizes(3, time.Millisecond, []ccompare.Size{{Name: "small", T: 3, D: 257}, {Name: "16k", T: 1, D: 4096}})
	require.NoError(t, err)
	require.Len(t, rs, 2)
	for _, r := range rs {
		require.Positive(t, r.OursNs)
		require.Positive(t, r.CNs)
		require.Positive(t, r.GoLoopNs)
		require.Contains(t, ccompare.Variants, r.CVariant)
	}
	require.NotContains(t, rs[0].CVariant, "-d4096", "D = 257 cannot run a compile-time-D variant")
}

// BenchmarkCompare prints the ours-vs-C-vs-Go table. Run it once:
//
//	go test -run '^$' -bench Compare -benchtime 1x ./kernels/ccompare
//
// CCOMPARE_ROUNDS (default 15) and CCOMPARE_MIN_MS (default 20) tune it.
func BenchmarkCompare(b *testing.B) {
	if !ccompare.Available() {
		b.Skip("built without cgo")
	}
	rounds, minMs := 15, 20
	if s := os.Getenv("CCOMPARE_ROUNDS"); s != "" {
		_, _ = fmt.Sscan(s, &rounds)
	}
	if s := os.Getenv("CCOMPARE_MIN_MS"); s != "" {
		_, _ = fmt.Sscan(s, &minMs)
	}
	for b.Loop() {
		rs, err := ccompare.Run(rounds, time.Duration(minMs)*time.Millisecond)
		if err != nil {
			b.Fatal(err)
		}
		fmt.Print(ccompare.Format(rs))
	}
}

func TestVariantsMatchKernels(t *testing.T) {
	if !ccompare.Available() {
		require.ErrorIs(t, ccompare.AddRowsVariantRepeat("native", make([]float32, 4), 4, 1, make([]float32, 4), 1), ccompare.ErrUnavailable)
		t.Skip("built without cgo")
	}
	const d, rows = ccompare.ConstD, 3
	for _, variant := range ccompare.Variants {
		t.Run(variant, func(t *testing.T) {
			h := make([]float32, rows*d)
			v := make([]float32, d)
			for i := range h {
				h[i] = float32(math.Sin(float64(i)))
			}
			for i := range v {
				v[i] = float32(math.Cos(float64(i)))
			}
			want := append([]float32(nil), h...)
			kernels.AddRows(want, d, 0.37, v)
			kernels.AddRows(want, d, 0.37, v)
			require.NoError(t, ccompare.AddRowsVariantRepeat(variant, h, d, 0.37, v, 2))
			for i := range h {
				require.InDelta(t, float64(want[i]), float64(h[i]), 1e-6*(math.Abs(float64(want[i]))+1), "i=%d", i)
			}
		})
	}
	odd := make([]float32, 2*257)
	require.ErrorIs(t, ccompare.AddRowsVariantRepeat("native-d4096", odd, 257, 1, make([]float32, 257), 1), ccompare.ErrVariant)
	require.ErrorIs(t, ccompare.AddRowsVariantRepeat("clang", odd, 257, 1, make([]float32, 257), 1), ccompare.ErrVariant)
	require.NoError(t, ccompare.AddRowsVariantRepeat("native512", odd, 257, 1, make([]float32, 257), 1))
}
