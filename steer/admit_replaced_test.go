package steer

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Admitted.Replaced says whether an admission replaced a live entry of its id; an ended id
// admitted again is new.
func TestAdmittedReplaced(t *testing.T) {
	e := newOwner(t, smallCfg, Options{})
	a, err := e.Admit(Admission{RequestID: "r"})
	require.NoError(t, err)
	require.False(t, a.Replaced)
	a, err = e.Admit(Admission{RequestID: "r"})
	require.NoError(t, err)
	require.True(t, a.Replaced, "a live id admitted again")
	_, err = e.End("r")
	require.NoError(t, err)
	a, err = e.Admit(Admission{RequestID: "r"})
	require.NoError(t, err)
	require.False(t, a.Replaced, "ended: a new admission")
}

// SetStrictRequests makes one Stepper strict (Apply and a Batch's Resolve), as
// Options.StrictRequests makes them all; off again, the unknown span is counted.
func TestStepperSetStrictRequests(t *testing.T) {
	e := newOwner(t, smallCfg, Options{})
	_, err := e.Admit(Admission{RequestID: "known"})
	require.NoError(t, err)
	hook, err := smallCfg.Hook("post_block")
	require.NoError(t, err)
	st := e.NewStepper()
	defer st.Close()
	h := make([]float32, 2*smallCfg.Hidden)
	batch := []Span{{ID: "known", Start: 0, End: 1, Phase: PhaseDecode}, {ID: "typo", Start: 1, End: 2, Phase: PhaseDecode}}
	st.SetStrictRequests(true)
	require.NoError(t, st.Begin(0))
	require.ErrorIs(t, st.Apply(hook, 0, h, batch), ErrUnknownRequest)
	st.End()
	b, err := st.NewBatch(BatchOptions{})
	require.NoError(t, err)
	require.ErrorIs(t, b.Resolve(0, batch, 2), ErrUnknownRequest)
	st.End()
	st.SetStrictRequests(false)
	require.NoError(t, st.Begin(0))
	require.NoError(t, st.Apply(hook, 0, h, batch))
	st.End()
	require.NotZero(t, st.Stats().UnknownRequests)
}
