package dense

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"gorgonia.org/tensor"

	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
)

var smallCfg = steer.ModelConfig{Hidden: 40, Layers: 3}

func newOwner(t testing.TB, cfg steer.ModelConfig) *steer.Owner {
	t.Helper()
	rc, err := steer.RegionConfig(cfg, shm.Config{IndexSlots: 1 << 10, ArenaBytes: 1 << 20, ReaderSlots: 16})
	require.NoError(t, err)
	r, err := shm.Create(rc)
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	e, err := steer.Open(r, &cfg, steer.Options{Logf: t.Logf})
	require.NoError(t, err)
	return e
}

func TestApplyDense(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	e := newOwner(t, smallCfg)
	d := smallCfg.Hidden
	v := make([]float32, d)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	_, err := e.Admit(steer.Admission{RequestID: "r", Override: &steer.Steering{Base: steer.Tier{Vectors: []steer.Vector{{Hook: "post_attn", Layer: 1, Scale: 1, Data: v}}}}})
	require.NoError(t, err)
	st := e.NewStepper()
	defer st.Close()
	require.NoError(t, st.Begin(0))
	defer st.End()
	batch := []steer.Span{{ID: "r", Start: 1, End: 2, Phase: steer.PhaseDecode}}

	// [2, 3, d]: rows are flattened; the buffer is steered in place.
	buf := make([]float32, 6*d)
	t3 := tensor.New(tensor.WithShape(2, 3, d), tensor.WithBacking(buf))
	require.NoError(t, Apply(st, 1, 1, t3, batch))
	require.Equal(t, v, buf[d:2*d])
	require.Equal(t, make([]float32, d), buf[:d])

	// A row slice of a larger matrix is contiguous: accepted, and it aliases the parent.
	big := make([]float32, 8*d)
	m := tensor.New(tensor.WithShape(8, d), tensor.WithBacking(big))
	rows, err := m.Slice(tensor.S(4, 8))
	require.NoError(t, err)
	require.NoError(t, Apply(st, 1, 1, rows.(*tensor.Dense), batch))
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
		"wrong width":  {tensor.New(tensor.WithShape(2, d+1), tensor.WithBacking(make([]float32, 2*d+2))), steer.ErrShape},
		"nil":          {nil, steer.ErrShape},
		"column slice": {cols.(*tensor.Dense), steer.ErrShape},
		"transposed":   {tr, ErrNotContiguous},
	}
	for name, tc := range cases {
		require.ErrorIs(t, Apply(st, 1, 1, tc.t, batch), tc.err, name)
	}
	// A column slice whose last dimension does equal the hidden size is rejected as strided.
	wide := tensor.New(tensor.WithShape(3, 2*d), tensor.WithBacking(make([]float32, 6*d)))
	half, err := wide.Slice(nil, tensor.S(0, d))
	require.NoError(t, err)
	require.ErrorIs(t, Apply(st, 1, 1, half.(*tensor.Dense), []steer.Span{{ID: "r", Start: 0, End: 1, Phase: steer.PhaseDecode}}), ErrNotContiguous)
}
