package steer

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOverlappingSpansRefused: spans sharing a row are refused with ErrBadBatch (the row used to
// get both requests' steering), by Apply and by Batch.Resolve, and the rows are untouched;
// disjoint spans in any order and empty spans are accepted.
func TestOverlappingSpansRefused(t *testing.T) {
	e := newOwner(t, smallCfg, Options{})
	_, ids, err := scenario(e, 11)
	require.NoError(t, err)
	d := smallCfg.Hidden
	st := e.NewStepper()
	defer st.Close()
	bad := [][]Span{
		{{ID: ids[0], Start: 0, End: 2, Phase: PhaseDecode}, {ID: ids[1], Start: 1, End: 3, Phase: PhaseDecode}},
		{{ID: ids[0], Start: 2, End: 4, Phase: PhaseDecode}, {ID: ids[1], Start: 0, End: 1, Phase: PhaseDecode}, {ID: ids[2], Start: 3, End: 4, Phase: PhasePrefill}},
		{{ID: ids[0], Start: 0, End: 4, Phase: PhaseDecode}, {ID: ids[1], Start: 1, End: 2, Phase: PhaseDecode}},
		{{ID: ids[0], Start: 1, End: 2, Phase: PhaseDecode}, {ID: ids[0], Start: 1, End: 2, Phase: PhasePrefill}},
	}
	for i, batch := range bad {
		require.NoError(t, st.Begin(0))
		h := make([]float32, 4*d)
		err := st.Apply(0, 0, h, batch)
		require.ErrorIs(t, err, ErrBadBatch, "batch %d", i)
		require.Contains(t, err.Error(), "overlaps")
		require.Equal(t, make([]float32, 4*d), h, "batch %d: nothing applied", i)
		st.End()
		b, err := st.NewBatch(BatchOptions{MaxSlots: 8, MaxClamps: 4})
		require.NoError(t, err)
		require.ErrorIs(t, b.Resolve(0, batch, 4), ErrBadBatch, "batch %d", i)
	}
	good := [][]Span{
		{{ID: ids[0], Start: 2, End: 4, Phase: PhaseDecode}, {ID: ids[1], Start: 0, End: 2, Phase: PhaseDecode}},
		{{ID: ids[0], Start: 0, End: 2, Phase: PhaseDecode}, {ID: ids[1], Start: 1, End: 1, Phase: PhaseDecode}, {ID: ids[2], Start: 2, End: 4, Phase: PhasePrefill}},
		{{ID: ids[0], Start: 3, End: 4, Phase: PhaseDecode}, {ID: ids[1], Start: 0, End: 1, Phase: PhaseDecode}, {ID: ids[2], Start: 1, End: 3, Phase: PhasePrefill}},
	}
	for i, batch := range good {
		require.NoError(t, st.Begin(0))
		require.NoError(t, st.Apply(0, 0, make([]float32, 4*d), batch), "batch %d", i)
		st.End()
	}
}
