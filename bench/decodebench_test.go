package bench

import (
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDecodeStepMatchesKernel checks that the two sides of each decode figure compute the same
// thing: one step through the Stepper leaves h where the bare gather-add of the same vectors
// does, for the dense and the sparse batch (and the scattered kernel, the dense batch's
// diagnostic, where the gather-add does, bit for bit), and a steady-state step allocates
// nothing.
func TestDecodeStepMatchesKernel(t *testing.T) {
	for _, tc := range []struct {
		name   string
		sparse bool
	}{{"dense", false}, {"sparse", true}} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := newDecodeFixture(tc.sparse, true)
			require.NoError(t, err)
			defer f.region.Close()
			k, err := newDecodeFixture(tc.sparse, false)
			require.NoError(t, err)
			require.Equal(t, f.h, k.h, "same seed, same rows")
			st := f.engine.NewStepper()
			defer st.Close()
			require.NoError(t, f.step(st))
			k.kernelStep(k.h)
			steeredRows := 0
			for i := range decodeRequests {
				row, want := f.h[i*stepD:(i+1)*stepD], k.h[i*stepD:(i+1)*stepD]
				for j := range row {
					require.InDelta(t, want[j], row[j], 1e-4*(1+math.Abs(float64(want[j]))), "request %d element %d", i, j)
				}
				if steered(i, tc.sparse) {
					steeredRows++
				}
			}
			want := decodeRequests
			if tc.sparse {
				want = decodeSparse
			}
			require.Equal(t, want, steeredRows)
			if !tc.sparse {
				sc, err := newScatteredFixture()
				require.NoError(t, err)
				defer func() { require.NoError(t, sc.close()) }()
				sc.step(sc.h) // the same kernel over the same rows: the same bits
				require.Equal(t, k.h, sc.h, "the scattered kernel's step")
			}
			allocs := testing.AllocsPerRun(3, func() { require.NoError(t, f.step(st)) })
			require.Zero(t, allocs, "allocations per steady-state decode step")
		})
	}
}

// BenchmarkDecodeStep is the Go benchmark of steer.step.decode.*: a whole decode step (64
// requests × 1 row, 160 sites, D = 4096) through the Stepper, dense and sparse, against the
// bare gather-add. It fails if a steady-state step allocates. Run:
//
//	go test -run '^$' -bench DecodeStep -benchmem ./cmd/shmsteer/
func BenchmarkDecodeStep(b *testing.B) {
	for _, sparse := range []bool{false, true} {
		name := "dense"
		if sparse {
			name = "sparse"
		}
		b.Run(name+"/mixed", func(b *testing.B) {
			f, err := newDecodeFixture(sparse, true)
			if err != nil {
				b.Fatal(err)
			}
			defer f.region.Close()
			st := f.engine.NewStepper()
			defer st.Close()
			if err := f.step(st); err != nil {
				b.Fatal(err)
			}
			if allocs := testing.AllocsPerRun(3, func() { _ = f.step(st) }); allocs != 0 {
				b.Fatalf("%v allocations per decode step, want 0", allocs)
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := f.step(st); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/kernel", func(b *testing.B) {
			k, err := newDecodeFixture(sparse, false)
			if err != nil {
				b.Fatal(err)
			}
			h := slices.Clone(k.h)
			b.ReportAllocs()
			for b.Loop() {
				k.kernelStep(h)
			}
		})
	}
}
