package steer

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestApplyBoundMatchesApply steps batches through Apply (the batch at every site) and through
// Bind and ApplyBound, from the same h, and requires the same rows bit for bit at every site,
// the same checksum and the same counts: decode batches (runs of adjacent cells, vectors in
// entries, act 0 at some sites, a clamp, a global vector), prefill and mixed ones (multi-row
// spans), an unknown request and the empty batch.
func TestApplyBoundMatchesApply(t *testing.T) {
	e, cfg := mixedDecodeEngine(t)
	d := cfg.Hidden
	decode := decodeRows
	batches := [][]Span{
		decode("c-0", "c-1", "c-2", "c-3", "one-site"),
		decode("c-0", "c-1", "entry-a", "c-2", "c-3", "plain", "one-site", "entry-b"),
		decode("entry-a", "c-0", "c-1", "c-3", "c-2", "one-site"),
		decode("one-site", "c-3", "c-2", "c-1", "c-0", "entry-b", "plain", "never-admitted"),
		decode("c-0", "c-1"),
		{{ID: "c-1", Start: 0, End: 3, Phase: PhasePrefill}, {ID: "c-0", Start: 3, End: 4, Phase: PhaseDecode}, {ID: "entry-a", Start: 5, End: 7, Phase: PhasePrefill}},
		{{ID: "c-3", Start: 1, End: 2, Phase: PhasePrefill}, {ID: "c-0", Start: 0, End: 1, Phase: PhaseDecode}, {ID: "c-1", Start: 2, End: 2, Phase: PhaseDecode}},
		nil,
	}
	ap, bd := e.NewStepper(), e.NewStepper()
	defer ap.Close()
	defer bd.Close()
	rng := rand.New(rand.NewPCG(5, 6))
	for bi, batch := range batches {
		rows := 8
		h0 := randVec(rng, rows*d)
		require.NoError(t, ap.Begin(0))
		require.NoError(t, bd.Begin(0))
		require.NoError(t, bd.Bind(batch, rows))
		requireBoundMatchesApply(t, cfg, ap, bd, h0, batch, fmt.Sprint("batch ", bi), func(hk, l int, hb []float32) {
			if len(batch) > 0 && hk != 2 {
				require.NotEqual(t, h0, hb, "batch %d, site %d/%d: something is steered", bi, hk, l)
			}
		})
		require.Equal(t, ap.End(), bd.End(), "checksum of batch %d", bi)
		sa, sb := ap.Stats(), bd.Stats()
		require.Equal(t, sa.Applies, sb.Applies)
		require.Equal(t, sa.ColumnRuns, sb.ColumnRuns, "batch %d", bi)
		require.Equal(t, sa.RunRows, sb.RunRows, "batch %d", bi)
		require.Equal(t, sa.UnknownRequests, sb.UnknownRequests)
	}
	require.Positive(t, bd.Stats().ColumnRuns, "the decode batches make runs")
}

// TestBindErrors: ApplyBound needs a bound batch of this step; Bind refuses what Apply refuses
// and leaves the step unbound; a refused ApplyBound changes nothing; the binding is a copy, and
// ends with the step, with the next Bind and with an Apply of another batch.
func TestBindErrors(t *testing.T) {
	e, cfg := mixedDecodeEngine(t)
	d := cfg.Hidden
	st := e.NewStepper()
	defer st.Close()
	batch := []Span{{ID: "c-0", Start: 0, End: 1, Phase: PhaseDecode}, {ID: "c-1", Start: 1, End: 2, Phase: PhaseDecode}}
	h0 := randVec(rand.New(rand.NewPCG(1, 2)), 2*d)
	h := slices.Clone(h0)

	require.ErrorIs(t, st.Bind(batch, 2), ErrNoStep, "outside a step")
	require.NoError(t, st.Begin(0))
	require.ErrorIs(t, st.ApplyBound(0, 0, h), ErrNoStep, "nothing bound")
	require.ErrorIs(t, st.Bind(batch, 1), ErrBadBatch, "a span past the block")
	require.ErrorIs(t, st.ApplyBound(0, 0, h), ErrNoStep, "a refused Bind binds nothing")
	require.ErrorIs(t, st.Bind(batch, -1), ErrShape)
	require.ErrorIs(t, st.Bind([]Span{{ID: "c-0", Start: 0, End: 1, Phase: 7}}, 2), ErrBadBatch)
	require.Equal(t, h0, h)

	require.NoError(t, st.Bind(batch, 2))
	batch[0].ID = "c-3" // the caller's slice: the binding is a copy
	require.ErrorIs(t, st.ApplyBound(0, 0, h[:d]), ErrShape, "not the bound block")
	require.ErrorIs(t, st.ApplyBound(0, 0, append(slices.Clone(h), 0)), ErrShape)
	require.ErrorIs(t, st.ApplyBound(HookID(cfg.NumHooks()), 0, h), ErrUnknownHook)
	require.ErrorIs(t, st.ApplyBound(0, cfg.Layers, h), ErrLayerRange)
	require.ErrorIs(t, st.ApplyBound(0, -1, h), ErrLayerRange)
	require.Equal(t, h0, h, "refused ApplyBounds changed h")
	require.NoError(t, st.ApplyBound(0, 0, h))
	want := slices.Clone(h0)
	ref := e.NewStepper()
	defer ref.Close()
	require.NoError(t, ref.Begin(0))
	require.NoError(t, ref.Apply(0, 0, want, []Span{{ID: "c-0", Start: 0, End: 1, Phase: PhaseDecode}, {ID: "c-1", Start: 1, End: 2, Phase: PhaseDecode}}))
	require.Equal(t, want, h, "the bound layout, not the edited slice")

	require.NoError(t, st.Apply(0, 1, h, batch), "an Apply of another batch")
	require.ErrorIs(t, st.ApplyBound(0, 0, h), ErrNoStep, "unbinds")
	require.NoError(t, st.Bind(batch, 2))
	require.NoError(t, st.Apply(0, 1, h, batch), "an Apply of the bound batch keeps it")
	require.NoError(t, st.ApplyBound(0, 2, h))
	st.End()
	require.ErrorIs(t, st.ApplyBound(0, 0, h), ErrNoStep, "after End")
	require.NoError(t, st.Begin(0))
	require.ErrorIs(t, st.ApplyBound(0, 0, h), ErrNoStep, "a new step starts unbound")
}

// TestBindReplans binds one decode batch step after step while the owner changes what it
// steers between steps (a request ended and admitted again with other vectors, the global
// steering moved to other sites, a request ended for good, its reqState recycled for another
// id) and requires ApplyBound to match Apply at every site each step: a site's program is
// reused only while nothing it was built from changed.
func TestBindReplans(t *testing.T) {
	e, cfg := mixedDecodeEngine(t)
	d := cfg.Hidden
	var batch []Span
	for i, id := range []string{"c-0", "c-1", "c-3", "one-site", "entry-a"} {
		batch = append(batch, Span{ID: id, Start: i, End: i + 1, Phase: PhaseDecode})
	}
	ap, bd := e.NewStepper(), e.NewStepper()
	defer ap.Close()
	defer bd.Close()
	rng := rand.New(rand.NewPCG(9, 10))
	changes := []func(){
		func() {},
		func() {
			_, err := e.End("c-0")
			require.NoError(t, err)
			_, err = e.Admit(Admission{RequestID: "c-0", Override: colSteering(cfg, 8)})
			require.NoError(t, err)
		},
		func() {
			var g Steering
			g.Base.Vectors = []Vector{{Hook: cfg.HookName(0), Layer: 1, Scale: 1, Data: filled(d, -0.5)}}
			_, err := e.SetGlobal(g)
			require.NoError(t, err)
		},
		func() {
			_, err := e.SetGlobal(Steering{})
			require.NoError(t, err)
		},
		func() {
			_, err := e.End("c-3")
			require.NoError(t, err)
		},
		func() {
			_, err := e.Admit(Admission{RequestID: "c-3", Override: colSteering(cfg, 2)})
			require.NoError(t, err)
		},
	}
	for step, change := range changes {
		change()
		for range 2 { // the second step of each state reuses the program
			h0 := randVec(rng, len(batch)*d)
			require.NoError(t, ap.Begin(0))
			require.NoError(t, bd.Begin(0))
			require.NoError(t, bd.Bind(batch, len(batch)))
			require.True(t, bd.reuseProgram(), "a program just built or reused is current")
			requireBoundMatchesApply(t, cfg, ap, bd, h0, batch, fmt.Sprint("change ", step), nil)
			require.Equal(t, ap.End(), bd.End(), "checksum after change %d", step)
		}
	}
	// A stepper whose reqStates were recycled (65 idle steps) for other ids.
	for range 70 {
		require.NoError(t, bd.Begin(0))
		require.NoError(t, bd.Bind([]Span{{ID: "entry-b", Start: 0, End: 1, Phase: PhaseDecode}}, 1))
		bd.End()
	}
	h0 := randVec(rng, len(batch)*d)
	ha, hb := slices.Clone(h0), slices.Clone(h0)
	require.NoError(t, ap.Begin(0))
	require.NoError(t, bd.Begin(0))
	require.NoError(t, bd.Bind(batch, len(batch)))
	require.NoError(t, ap.Apply(1, 2, ha, batch))
	require.NoError(t, bd.ApplyBound(1, 2, hb))
	require.Equal(t, ha, hb)
	require.Equal(t, ap.End(), bd.End())
}

// FuzzBindMatchesApply decodes a batch (spans of the fixture's requests, unknown and empty
// ids, any rows and phases: overlapping, out of range, empty, out of order) and a block size
// from the input, and requires Bind to refuse exactly what Apply refuses, with the same
// sentinel and h untouched, and otherwise ApplyBound to steer every site as Apply does, bit for
// bit, with the same checksum.
func FuzzBindMatchesApply(f *testing.F) {
	f.Add([]byte{5, 0, 0, 2, 2, 1, 1, 2, 2, 2, 2, 2, 2, 3, 3, 2, 2})
	f.Add([]byte{8, 0, 0, 3, 1, 4, 3, 2, 2, 6, 6, 2, 1})
	f.Add([]byte{3, 0, 0, 1, 2, 1, 0, 2, 2})
	f.Add([]byte{2, 7, 0, 2, 2, 8, 1, 2, 3})
	e, cfg := mixedDecodeEngine(f)
	d := cfg.Hidden
	ids := []string{"c-0", "c-1", "c-2", "c-3", "one-site", "entry-a", "entry-b", "plain", "unknown", ""}
	ap, bd := e.NewStepper(), e.NewStepper()
	f.Cleanup(func() { ap.Close(); bd.Close() })
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) == 0 {
			return
		}
		rows := int(in[0] % 10)
		var batch []Span
		for in = in[1:]; len(in) >= 4 && len(batch) < 16; in = in[4:] {
			start := int(int8(in[1])) % 12
			batch = append(batch, Span{ID: ids[int(in[0])%len(ids)], Start: start, End: start + int(in[2]%5) - 1, Phase: Phase(in[3] % 4)})
		}
		h0 := make([]float32, rows*d)
		for i := range h0 {
			h0[i] = float32(i%7) - 3
		}
		ha, hb := slices.Clone(h0), slices.Clone(h0)
		require.NoError(t, ap.Begin(0))
		require.NoError(t, bd.Begin(0))
		defer ap.End()
		defer bd.End()
		errA := ap.Apply(0, 0, ha, batch)
		errB := bd.Bind(batch, rows)
		if errA != nil {
			require.Error(t, errB, "Apply refused %v: %v", batch, errA)
			for _, sentinel := range []error{ErrBadBatch, ErrShape, ErrUnknownRequest} {
				require.Equal(t, errors.Is(errA, sentinel), errors.Is(errB, sentinel), "%v / %v", errA, errB)
			}
			require.Equal(t, h0, ha)
			require.ErrorIs(t, bd.ApplyBound(0, 0, hb), ErrNoStep, "a refused Bind binds nothing")
			require.Equal(t, h0, hb)
			return
		}
		require.NoError(t, errB, "Apply took %v", batch)
		require.NoError(t, bd.ApplyBound(0, 0, hb))
		require.Equal(t, ha, hb)
		for hk := range cfg.NumHooks() {
			for l := range cfg.Layers {
				require.NoError(t, ap.Apply(HookID(hk), l, ha, batch))
				require.NoError(t, bd.ApplyBound(HookID(hk), l, hb))
				require.Equal(t, ha, hb, "site %d/%d, batch %v", hk, l, batch)
			}
		}
		require.Equal(t, ap.Checksum(), bd.Checksum())
	})
}

// requireBoundMatchesApply applies batch at every site of cfg, each time from h0, through ap's
// Apply and bd's ApplyBound (both in a step, bd's batch bound), and requires the same rows at
// each site; each, when not nil, then sees the site and bd's rows.
func requireBoundMatchesApply(t *testing.T, cfg ModelConfig, ap, bd *Stepper, h0 []float32, batch []Span, what string, each func(hk, l int, hb []float32)) {
	t.Helper()
	ha, hb := make([]float32, len(h0)), make([]float32, len(h0))
	for hk := range cfg.NumHooks() {
		for l := range cfg.Layers {
			copy(ha, h0)
			copy(hb, h0)
			require.NoError(t, ap.Apply(HookID(hk), l, ha, batch))
			require.NoError(t, bd.ApplyBound(HookID(hk), l, hb))
			require.Equal(t, ha, hb, "%s, site %d/%d", what, hk, l)
			if each != nil {
				each(hk, l, hb)
			}
		}
	}
}
