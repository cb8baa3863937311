package steer

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// runPlain adds a plain site's adds to h, a block of rows of d floats, as a caller outside Go
// would: each sum rounded once, h + v or h + (v + g).
func runPlain(h []float32, d int, adds []PlainAdd) {
	for _, a := range adds {
		for r := a.Start; r < a.End; r++ {
			row := h[r*d : (r+1)*d]
			for j := range row {
				switch a.Kind {
				case PlainEach:
					row[j] += a.V[j]
				case PlainBlock:
					row[j] += a.V[(r-a.Start)*d+j]
				case PlainPair:
					row[j] += a.V[j] + a.G[j]
				}
			}
		}
	}
}

// TestPlainSitesMatchApply steps batches on two Steppers of one engine: one through Apply at
// every site, the other running each plain site's adds itself (PlainSite, then Replay) and
// Apply elsewhere. Same bits, same checksum, same counts, step after step (the program kept
// from step to step, rebuilt when the batch changes); the batches have runs of pool cells,
// entries, a global vector (pairs), a clamp (a site that is not plain), unsteered and unknown
// requests, prefill spans of several rows.
func TestPlainSitesMatchApply(t *testing.T) {
	e, cfg := mixedDecodeEngine(t)
	d := cfg.Hidden
	decode := decodeRows
	first := decode("c-0", "c-1", "c-2", "c-3", "one-site")
	batches := [][]Span{
		first, first, first,
		decode("c-0", "c-1", "entry-a", "c-2", "c-3", "plain", "one-site", "entry-b"),
		decode("one-site", "c-3", "c-2", "c-1", "c-0", "entry-b", "plain", "never-admitted"),
		{{ID: "c-1", Start: 0, End: 3, Phase: PhasePrefill}, {ID: "c-0", Start: 3, End: 4, Phase: PhaseDecode}, {ID: "entry-a", Start: 5, End: 7, Phase: PhasePrefill}},
		first,
	}
	ap, pl := e.NewStepper(), e.NewStepper()
	defer ap.Close()
	defer pl.Close()
	rng := rand.New(rand.NewPCG(11, 12))
	kinds := map[PlainKind]int{}
	plain, other, reused := 0, 0, 0
	var adds []PlainAdd
	for bi, batch := range batches {
		rows := 8
		require.NoError(t, ap.Begin(0))
		require.NoError(t, pl.Begin(0))
		gen := pl.Generation()
		for hk := range cfg.NumHooks() {
			for l := range cfg.Layers {
				what := fmt.Sprintf("batch %d site %d/%d", bi, hk, l)
				want := randVec(rng, rows*d)
				got := slices.Clone(want)
				require.NoError(t, ap.Apply(HookID(hk), l, want, batch), what)
				if !pl.PlainStep() {
					// The step's first site resolves the batch; its program is the one the
					// sites after it reuse.
					require.NoError(t, pl.Apply(HookID(hk), l, got, batch), what)
					if pl.Generation() == gen {
						reused++
					}
					require.True(t, pl.PlainStep(), what)
					require.Equal(t, want, got, what)
					continue
				}
				var ok bool
				adds, ok = pl.PlainSite(adds[:0], HookID(hk), l)
				if !ok {
					other++
					require.Empty(t, adds, what)
					require.NoError(t, pl.Apply(HookID(hk), l, got, batch), what)
				} else {
					plain++
					for _, a := range adds {
						kinds[a.Kind]++
					}
					runPlain(got, d, adds)
					require.NoError(t, pl.Replay(HookID(hk), l), what)
				}
				require.Equal(t, want, got, what)
			}
		}
		require.Equal(t, ap.End(), pl.End(), "batch %d checksum", bi)
		require.Equal(t, ap.Stats().Applies, pl.Stats().Applies)
		require.Equal(t, ap.Stats().ColumnRuns, pl.Stats().ColumnRuns)
		require.Equal(t, ap.Stats().RunRows, pl.Stats().RunRows)
	}
	require.Positive(t, other, "the clamped site is not plain")
	require.Greater(t, plain, 2*other)
	require.Positive(t, kinds[PlainEach])
	require.Positive(t, kinds[PlainBlock], "runs of pool cells")
	require.Positive(t, kinds[PlainPair], "the global vector with a request's")
	require.Positive(t, reused, "a repeated batch keeps its program's generation")
}

// TestPlainSumIsTheEnd: PlainSum of the sites a step replays next, asked before they run, is
// the checksum End returns after them, in either order, and asking changes nothing of the step.
func TestPlainSumIsTheEnd(t *testing.T) {
	e, cfg := mixedDecodeEngine(t)
	L := cfg.Layers
	batch := decodeRows("c-0", "c-1", "c-2", "c-3", "plain", "one-site")
	s := e.NewStepper()
	defer s.Close()
	rng := rand.New(rand.NewPCG(13, 14))
	for round := range 3 {
		what := fmt.Sprint("round ", round)
		require.NoError(t, s.Begin(0))
		require.NoError(t, s.Apply(0, 0, randVec(rng, 8*cfg.Hidden), batch), what) // resolves the batch
		var sites []uint32
		for site := 1; site < cfg.NumHooks()*L; site++ {
			if _, ok := s.PlainSite(nil, HookID(site/L), site%L); ok {
				sites = append(sites, uint32(site))
			}
		}
		require.Greater(t, len(sites), 2, what)
		if round == 1 {
			slices.Reverse(sites)
		}
		before, stats := s.Checksum(), s.Stats()
		sum, ok := s.PlainSum(sites)
		require.True(t, ok, what)
		require.Equal(t, before, s.Checksum(), what)
		require.Equal(t, stats, s.Stats(), what)
		for _, site := range sites {
			require.NoError(t, s.Replay(HookID(int(site)/L), int(site)%L), what)
		}
		require.NotEqual(t, before, sum, what)
		require.Equal(t, sum, s.End(), what)
	}
}

// TestPlainRefusals: no plain site outside a resolved step or out of range, no replay of a site
// that is not plain or outside a step, and a capturing step is never plain.
func TestPlainRefusals(t *testing.T) {
	e, cfg := mixedDecodeEngine(t)
	s := e.NewStepper()
	defer s.Close()
	_, ok := s.PlainSite(nil, 0, 0)
	require.False(t, ok, "no step")
	require.ErrorIs(t, s.Replay(0, 0), ErrNoStep)
	_, ok = s.PlainSum([]uint32{uint32(cfg.Layers + 1)})
	require.False(t, ok, "no step")
	require.NoError(t, s.Begin(0))
	_, ok = s.PlainSite(nil, 0, 0)
	require.False(t, ok, "no batch resolved")
	batch := []Span{{ID: "c-2", Start: 0, End: 1, Phase: PhaseDecode}}
	h := make([]float32, cfg.Hidden)
	require.NoError(t, s.Apply(1, 0, h, batch))
	_, ok = s.PlainSite(nil, HookID(cfg.NumHooks()), 0)
	require.False(t, ok, "hook out of range")
	_, ok = s.PlainSite(nil, 0, cfg.Layers)
	require.False(t, ok, "layer out of range")
	// c-2 has a clamp at pre_attn, layer 1: that site is not plain, and cannot be replayed.
	_, ok = s.PlainSite(nil, 0, 1)
	require.False(t, ok, "a clamped site")
	require.ErrorIs(t, s.Replay(0, 1), ErrBadBatch)
	_, ok = s.PlainSum([]uint32{uint32(cfg.Layers + 1), 1})
	require.False(t, ok, "a clamped site")
	_, ok = s.PlainSum([]uint32{uint32(cfg.NumHooks() * cfg.Layers)})
	require.False(t, ok, "a site out of range")
	before := s.Checksum()
	adds, ok := s.PlainSite(nil, 1, 1)
	require.True(t, ok)
	require.NotEmpty(t, adds)
	require.NoError(t, s.Replay(1, 1))
	require.NotEqual(t, before, s.Checksum(), "a replay folds the site")
	s.End()

	// A step that captures runs every site through Apply (capture reads the rows first).
	require.NoError(t, s.SetCapture(CaptureOptions{Sink: nopSink{}}))
	require.NoError(t, s.Begin(0))
	require.NoError(t, s.Apply(1, 0, h, batch))
	require.False(t, s.PlainStep())
	_, ok = s.PlainSite(nil, 1, 1)
	require.False(t, ok, "capturing")
	err := s.Replay(1, 1)
	require.True(t, errors.Is(err, ErrBadBatch), "%v", err)
	s.End()
}

// nopSink takes every capture record and keeps none.
type nopSink struct{}

func (nopSink) Capture(*CaptureRecord) error { return nil }
