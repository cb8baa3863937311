package steer

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// Effective gives what Apply adds, and its digest changes exactly when the composition does.
func TestEffectiveMatchesApplyAndTracksChanges(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	e := newOwner(t, smallCfg, Options{})
	d := smallCfg.Hidden
	_, err := e.Register("n", []Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: randVec(rng, d)}})
	require.NoError(t, err)
	_, err = e.SetGlobal(Steering{Base: Tier{Vectors: []Vector{{Hook: "post_block", Layer: 1, Scale: 0.5, Data: randVec(rng, d)}}}})
	require.NoError(t, err)
	_, err = e.Admit(Admission{RequestID: "r", Override: &Steering{Decode: Tier{Refs: []Ref{{Name: "n", Strength: 2}}}}})
	require.NoError(t, err)
	hook, err := smallCfg.Hook("post_block")
	require.NoError(t, err)

	st := e.NewStepper()
	defer st.Close()
	_, err = st.Effective("r", hook, 1, PhaseDecode)
	require.ErrorIs(t, err, ErrNoStep)

	effAt := func() (Effective, []float32) {
		require.NoError(t, st.Begin(0))
		eff, err := st.Effective("r", hook, 1, PhaseDecode)
		require.NoError(t, err)
		h := make([]float32, d)
		require.NoError(t, st.Apply(hook, 1, h, []Span{{ID: "r", Start: 0, End: 1, Phase: PhaseDecode}}))
		return eff, h
	}
	eff1, h := effAt()
	require.InDeltaSlice(t, h, eff1.Sum(), 1e-6)
	require.NotNil(t, eff1.Request)
	require.NotNil(t, eff1.Global)
	require.Equal(t, e.Region().Version(), eff1.Version)
	vec1 := eff1.Sum()
	st.End()

	// Unchanged state: same digest and floats.
	eff2, _ := effAt()
	require.Equal(t, eff1.Digest, eff2.Digest)
	require.Equal(t, vec1, eff2.Sum())
	// Prefill has only the global vector; another layer has nothing.
	pre, err := st.Effective("r", hook, 1, PhasePrefill)
	require.NoError(t, err)
	require.Nil(t, pre.Request)
	require.NotEqual(t, vec1, pre.Sum())
	none, err := st.Effective("r", hook, 0, PhaseDecode)
	require.NoError(t, err)
	require.Nil(t, none.Sum())
	st.End()

	// Re-registering the referenced vector changes the digest and the floats.
	_, err = e.Register("n", []Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: randVec(rng, d)}})
	require.NoError(t, err)
	eff3, h := effAt()
	require.NotEqual(t, eff1.Digest, eff3.Digest)
	require.InDeltaSlice(t, h, eff3.Sum(), 1e-6)
	require.NotEqual(t, vec1, eff3.Sum())
	st.End()

	// Bad arguments are typed errors.
	require.NoError(t, st.Begin(0))
	defer st.End()
	_, err = st.Effective("r", HookID(99), 0, PhaseDecode)
	require.ErrorIs(t, err, ErrUnknownHook)
	_, err = st.Effective("r", hook, 9, PhaseDecode)
	require.ErrorIs(t, err, ErrLayerRange)
	_, err = st.Effective("", hook, 0, PhaseDecode)
	require.ErrorIs(t, err, ErrBadBatch)
}
