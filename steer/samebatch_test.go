package steer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStepNoticesLayoutChange edits, in place between two Applies of one step, each field of
// a span of the batch slice the Stepper compared last (the id, the rows, the phase) and checks
// that the second Apply steers the edited layout as a fresh Stepper does (the same floats and
// checksum), or refuses it when the edit made it invalid: the batch a later Apply of a step
// compares must be compared field by field.
func TestStepNoticesLayoutChange(t *testing.T) {
	cfg := ModelConfig{Hidden: 40, Layers: 2}
	e := newOwner(t, cfg, Options{})
	rng := rand.New(rand.NewPCG(7, 8))
	for _, id := range []string{"a", "b", "bx", "c", "cx"} {
		s := Steering{
			Prefill: Tier{Vectors: []Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: randVec(rng, cfg.Hidden)}}},
			Decode:  Tier{Vectors: []Vector{{Hook: "post_block", Layer: 1, Scale: 2, Data: randVec(rng, cfg.Hidden)}}},
		}
		_, err := e.Admit(Admission{RequestID: id, Override: &s})
		require.NoError(t, err)
	}
	hook, err := cfg.Hook("post_block")
	require.NoError(t, err)
	base := []Span{{ID: "a", Start: 0, End: 1, Phase: PhaseDecode}, {ID: "bx", Start: 1, End: 3, Phase: PhasePrefill}}
	edits := map[string]func(sp *Span){
		"id":       func(sp *Span) { sp.ID = "c" },
		"idsame":   func(sp *Span) { sp.ID = "cx" },                 // another id of the same length
		"idprefix": func(sp *Span) { sp.ID = sp.ID[:1] },            // "b": the same pointer, shorter
		"idcopy":   func(sp *Span) { sp.ID = strings.Clone(sp.ID) }, // the same id in other bytes
		"start":    func(sp *Span) { sp.Start = 0 },                 // overlaps span 0
		"end":      func(sp *Span) { sp.End = 1 },                   // empty: steers nothing, no checksum term
		"phase":    func(sp *Span) { sp.Phase = PhaseDecode },
		"bound":    func(sp *Span) { sp.End = 5 }, // past the block
		"badphase": func(sp *Span) { sp.Phase = 3 },
		"rows":     func(sp *Span) {}, // the same batch over a block of 2 rows
		"pos":      func(sp *Span) { sp.Pos = -1 },
	}
	for name, edit := range edits {
		t.Run(name, func(t *testing.T) {
			const rows = 4
			h0 := randVec(rng, rows*cfg.Hidden)
			batch := slices.Clone(base)
			st := e.NewStepper()
			defer st.Close()
			require.NoError(t, st.Begin(0))
			h := slices.Clone(h0)
			require.NoError(t, st.Apply(hook, 0, h, batch)) // layer 0: nothing steered, layout resolved
			edit(&batch[1])
			hb := h
			if name == "rows" {
				hb = h[:2*cfg.Hidden]
			}
			err := st.Apply(hook, 1, hb, batch)
			if name != "id" && name != "idsame" && name != "idprefix" && name != "idcopy" && name != "end" && name != "phase" {
				require.ErrorIs(t, err, ErrBadBatch)
				require.Equal(t, h0, h, "a refused batch changed h")
				return
			}
			require.NoError(t, err)
			sum := st.End()

			fresh := e.NewStepper()
			defer fresh.Close()
			require.NoError(t, fresh.Begin(0))
			want := slices.Clone(h0)
			require.NoError(t, fresh.Apply(hook, 1, want, batch))
			require.Equal(t, fresh.End(), sum, "checksum of the edited layout")
			require.Equal(t, want, h, "the edited layout was not re-resolved")
			require.NotEqual(t, h0, h)
			if name == "idcopy" {
				// The same layout: a Stepper that did not re-resolve it steers as one that did.
				require.Equal(t, sameLayoutSteered(t, e, hook, h0, base), h)
			}
		})
	}
}

// sameLayoutSteered is what Applies at layers 0 and 1 of one step steer in h0 for batch.
func sameLayoutSteered(t *testing.T, e *Owner, hook HookID, h0 []float32, batch []Span) []float32 {
	st := e.NewStepper()
	defer st.Close()
	require.NoError(t, st.Begin(0))
	h := slices.Clone(h0)
	require.NoError(t, st.Apply(hook, 0, h, batch))
	require.NoError(t, st.Apply(hook, 1, h, batch))
	st.End()
	return h
}

// TestStepRefusedBatchLeavesNoPlan: a batch refused after its first spans were resolved (here
// an overlap in its last span) leaves nothing of them behind: an Apply of an empty batch in
// the same step, or in the next, steers nothing. (Found by FuzzBindMatchesApply: the refused
// batch's steered spans were applied again.)
func TestStepRefusedBatchLeavesNoPlan(t *testing.T) {
	e, cfg := mixedDecodeEngine(t)
	d := cfg.Hidden
	st := e.NewStepper()
	defer st.Close()
	h0 := randVec(rand.New(rand.NewPCG(3, 3)), 2*d)
	h := slices.Clone(h0)
	require.NoError(t, st.Begin(0))
	bad := []Span{{ID: "c-0", Start: 0, End: 1, Phase: PhaseDecode}, {ID: "c-1", Start: 0, End: 2, Phase: PhaseDecode}}
	require.ErrorIs(t, st.Apply(0, 0, h, bad), ErrBadBatch)
	require.NoError(t, st.Apply(0, 0, h, nil))
	require.Equal(t, h0, h, "the refused batch's first span was applied")
	st.End()
	require.NoError(t, st.Begin(0))
	require.ErrorIs(t, st.Apply(0, 0, h, bad), ErrBadBatch)
	st.End()
	require.NoError(t, st.Begin(0))
	require.NoError(t, st.Apply(0, 0, h, []Span{}))
	require.Equal(t, h0, h, "in the next step")
	require.Zero(t, st.End())
}
