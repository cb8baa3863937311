package steer

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"gorgonia.org/tensor"
)

func TestApplyDense(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	e := newOwner(t, smallCfg, Options{})
	d := smallCfg.Hidden
	v := randVec(rng, d)
	_, err := e.Admit(Admission{RequestID: "r", Override: &Steering{Base: Tier{Vectors: []Vector{{Hook: "post_attn", Layer: 1, Scale: 1, Data: v}}}}})
	require.NoError(t, err)
	st := e.NewStepper()
	defer st.Close()
	require.NoError(t, st.Begin(0))
	defer st.End()
	batch := []Span{{ID: "r", Start: 1, End: 2, Phase: PhaseDecode}}

	// [2, 3, d]: rows are flattened; the buffer is steered in place.
	buf := make([]float32, 6*d)
	t3 := tensor.New(tensor.WithShape(2, 3, d), tensor.WithBacking(buf))
	require.NoError(t, st.ApplyDense(1, 1, t3, batch))
	require.Equal(t, v, buf[d:2*d])
	require.Equal(t, make([]float32, d), buf[:d])

	// A row slice of a larger matrix is contiguous: accepted, and it aliases the parent.
	big := make([]float32, 8*d)
	m := tensor.New(tensor.WithShape(8, d), tensor.WithBacking(big))
	rows, err := m.Slice(tensor.S(4, 8))
	require.NoError(t, err)
	require.NoError(t, st.ApplyDense(1, 1, rows.(*tensor.Dense), batch))
	require.Equal(t, v, big[5*d:6*d])

	cols, err := m.Slice(nil, tensor.S(0, d/2))
	require.NoError(t, err)
	tr := tensor.New(tensor.WithShape(d, 8), tensor.WithBacking(make([]float32, 8*d)))
	require.NoError(t, tr.T())
	cases := map[string]struct {
		t   *tensor.Dense
		err error
	}{
		"float64":      {tensor.New(tensor.WithShape(2, d), tensor.WithBacking(make([]float64, 2*d))), ErrDtype},
		"int":          {tensor.New(tensor.WithShape(2, d), tensor.WithBacking(make([]int, 2*d))), ErrDtype},
		"wrong width":  {tensor.New(tensor.WithShape(2, d+1), tensor.WithBacking(make([]float32, 2*d+2))), ErrShape},
		"nil":          {nil, ErrShape},
		"column slice": {cols.(*tensor.Dense), ErrShape},
		"transposed":   {tr, ErrNotContiguous},
	}
	for name, tc := range cases {
		require.ErrorIs(t, st.ApplyDense(1, 1, tc.t, batch), tc.err, name)
	}
	// A column slice whose last dimension does equal the hidden size is rejected as strided.
	wide := tensor.New(tensor.WithShape(3, 2*d), tensor.WithBacking(make([]float32, 6*d)))
	half, err := wide.Slice(nil, tensor.S(0, d))
	require.NoError(t, err)
	require.ErrorIs(t, st.ApplyDense(1, 1, half.(*tensor.Dense), []Span{{ID: "r", Start: 0, End: 1, Phase: PhaseDecode}}), ErrNotContiguous)
}
