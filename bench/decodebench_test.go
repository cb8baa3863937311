package bench

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDecodeStepMatchesKernel checks that the two sides of each decode figure compute the same
// thing, each from its own copy of the starting h (the figures share decodeH, so the fixtures'
// h is one slice): one step through the Stepper, the figure's kernel (the step's vectors read
// in place) and the scattered diagnostic (dense only) each leave h where a reference does, the
// bare gather-add of an independent copy of the vectors (made from the same seed, in the heap),
// bit for bit; the reference changes exactly the steered rows; a steady-state step allocates
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
			h0 := slices.Clone(f.h)
			want := slices.Clone(h0)
			f.kernelStep(want)
			changed := 0
			for i := range decodeRequests {
				row := want[i*stepD : (i+1)*stepD]
				if !slices.Equal(row, h0[i*stepD:(i+1)*stepD]) {
					changed++
					require.True(t, steered(i, tc.sparse), "request %d is not steered, its row changed", i)
				}
			}
			steeredRows := decodeRequests
			if tc.sparse {
				steeredRows = decodeSparse
			}
			require.Equal(t, steeredRows, changed, "rows the reference changed")

			st := f.engine.NewStepper()
			defer st.Close()
			f.h = slices.Clone(h0)
			require.NoError(t, f.step(st))
			requireSameBits(t, want, f.h, "the step")

			k, err := f.inPlace()
			require.NoError(t, err)
			got := slices.Clone(h0)
			k.step(got)
			k.close()
			requireSameBits(t, want, got, "the in-place kernel")

			if !tc.sparse {
				sc, err := newScatteredFixture()
				require.NoError(t, err)
				defer func() { require.NoError(t, sc.close()) }()
				sc.h = slices.Clone(h0)
				sc.step(sc.h)
				requireSameBits(t, want, sc.h, "the scattered kernel")
			}
			allocs := testing.AllocsPerRun(3, func() { require.NoError(t, f.step(st)) })
			require.Zero(t, allocs, "allocations per steady-state decode step")
		})
	}
}

// requireSameBits fails unless got holds want's floats bit for bit, naming the first row and
// element that differ.
func requireSameBits(t *testing.T, want, got []float32, what string) {
	t.Helper()
	require.Len(t, got, len(want), what)
	for j := range want {
		if math.Float32bits(want[j]) != math.Float32bits(got[j]) {
			require.Failf(t, "not the reference's bits", "%s: row %d element %d: %v, want %v", what, j/stepD, j%stepD, got[j], want[j])
		}
	}
}

// BenchmarkDecodeStep is the Go benchmark of steer.step.decode.*: a whole decode step (64
// requests × 1 row, 160 sites, D = 4096) through the Stepper, dense and sparse, with the batch
// bound (Bind, ApplyBound) and passed to every Apply, against the bare gather-add. It fails if
// a steady-state step allocates. Run:
//
//	go test -run '^$' -bench DecodeStep -benchmem ./bench/
func BenchmarkDecodeStep(b *testing.B) {
	for _, sparse := range []bool{false, true} {
		name := "dense"
		if sparse {
			name = "sparse"
		}
		for _, bound := range []bool{true, false} {
			mode := "/bound"
			if !bound {
				mode = "/apply"
			}
			b.Run(name+mode, func(b *testing.B) {
				f, err := newDecodeFixture(sparse, true)
				if err != nil {
					b.Fatal(err)
				}
				defer f.region.Close()
				st := f.engine.NewStepper()
				defer st.Close()
				step := f.step
				if bound {
					step = f.boundStep
				}
				if err := step(st); err != nil {
					b.Fatal(err)
				}
				if allocs := testing.AllocsPerRun(3, func() { _ = step(st) }); allocs != 0 {
					b.Fatalf("%v allocations per decode step, want 0", allocs)
				}
				b.ReportAllocs()
				for b.Loop() {
					if err := step(st); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		b.Run(name+"/kernel", func(b *testing.B) {
			f, err := newDecodeFixture(sparse, true)
			if err != nil {
				b.Fatal(err)
			}
			defer f.region.Close()
			k, err := f.inPlace()
			if err != nil {
				b.Fatal(err)
			}
			defer k.close()
			h := slices.Clone(f.h)
			b.ReportAllocs()
			for b.Loop() {
				k.step(h)
			}
		})
	}
}

// BenchmarkHeapPlacement shows why the decode kernels read their step's own vectors: two
// copies of the dense kernel's tables (the same floats, each table cloned in turn, one copy
// after the other, in the heap) gather-added into one h in alternating order, each iteration
// one round of both. Its metric a/b is the median over the rounds of copy a's time over copy
// b's: all that separates them is where each copy's 160 MiB happens to lie. Run it a few
// times, each in a process of its own:
//
//	go test -c -o /tmp/bench.test ./bench/
//	for i in 1 2 3 4 5; do /tmp/bench.test -test.run '^$' -test.bench HeapPlacement -test.benchtime 21x; done
func BenchmarkHeapPlacement(b *testing.B) {
	f, err := newDecodeFixture(false, false)
	require.NoError(b, err)
	clone := func() *decodeFixture {
		c := *f
		c.table = make([][]float32, len(f.table))
		for s, t := range f.table {
			c.table[s] = slices.Clone(t)
		}
		return &c
	}
	a, c := clone(), clone()
	f.table = nil
	h := slices.Clone(f.h)
	timed := func(f *decodeFixture) time.Duration {
		start := time.Now()
		f.kernelStep(h)
		return time.Since(start)
	}
	var ratios []float64
	round := 0
	for b.Loop() {
		var ta, tc time.Duration
		if round%2 == 0 {
			ta, tc = timed(a), timed(c)
		} else {
			tc, ta = timed(c), timed(a)
		}
		ratios = append(ratios, float64(ta)/float64(tc))
		round++
	}
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "a/b")
}
