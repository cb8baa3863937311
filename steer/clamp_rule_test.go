package steer

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// One clamp rule on every write path: strength in [0, 1]. A 9e29 vector plus a clamp of
// strength 9e29 (bounds [1, 1]) used to be admitted and wrote -Inf into the row; it is refused
// with ErrBadClamp by SetGlobal, Admit and the owner's RPC handler for a worker, and nothing
// changes. (The C ABI and HTTP reach the same owner-side check: capi's Python test and serve's
// API test cover them.)
func TestClampStrengthRuleEveryPath(t *testing.T) {
	d := smallCfg.Hidden
	e := newOwner(t, smallCfg, Options{})
	lb := loopback{}
	e.Serve(func(op uint16, h func([]byte) ([]byte, error)) { lb[op] = h })
	w := newReader(t, e, Options{Caller: lb})
	dir := make([]float32, d)
	dir[0] = 1
	big := Vector{Hook: "post_block", Layer: 1, Scale: 1, Data: filled(d, 9e29)}
	for _, str := range []float32{9e29, 1.0001, -0.5} {
		s := Steering{Base: Tier{Vectors: []Vector{big}, Clamps: []Clamp{{Hook: "post_block", Layer: 1, Dir: dir, Min: 1, Max: 1, Strength: str}}}}
		v0 := e.Region().Version()
		_, err := e.SetGlobal(s)
		require.ErrorIs(t, err, ErrBadClamp, "Go SetGlobal, strength %g", str)
		require.Contains(t, err.Error(), "not in [0, 1]")
		require.Contains(t, err.Error(), "global steering")
		_, err = e.Admit(Admission{RequestID: "r", Conversation: ConvKey{Tenant: "t", ID: "c"}, Override: &s})
		require.ErrorIs(t, err, ErrBadClamp, "Go Admit, strength %g", str)
		require.Contains(t, err.Error(), `request "r"`)
		_, err = w.SetGlobal(s)
		require.ErrorIs(t, err, ErrBadClamp, "worker RPC, strength %g", str)
		require.Equal(t, v0, e.Region().Version(), "a refused write changes nothing")
		require.Empty(t, e.Latches().Keys())
	}
}

// Within the rule the composed result stays finite and within the bound: global and request
// each add 9e29 at a site and each clamp the same direction with strength 1 (global to [1, 1],
// request to [-5e29, 5e29]); the row ends finite, its projection on the clamp direction back
// at the global's bounds and the other components at 1.8e30.
func TestClampComposedResultWithinBound(t *testing.T) {
	d := smallCfg.Hidden
	e := newOwner(t, smallCfg, Options{})
	dir := make([]float32, d)
	dir[0] = 1
	big := Vector{Hook: "post_block", Layer: 1, Scale: 1, Data: filled(d, 9e29)}
	g := Steering{Base: Tier{Vectors: []Vector{big}, Clamps: []Clamp{{Hook: "post_block", Layer: 1, Dir: dir, Min: 1, Max: 1, Strength: 1}}}}
	_, err := e.SetGlobal(g)
	require.NoError(t, err)
	r := Steering{Base: Tier{Vectors: []Vector{big}, Clamps: []Clamp{{Hook: "post_block", Layer: 1, Dir: dir, Min: -5e29, Max: 5e29, Strength: 1}}}}
	_, err = e.Admit(Admission{RequestID: "r", Override: &r})
	require.NoError(t, err)
	st := e.NewStepper()
	defer st.Close()
	require.NoError(t, st.Begin(0))
	h := make([]float32, 2*d)
	require.NoError(t, st.Apply(2, 1, h, []Span{{ID: "r", Start: 0, End: 2, Phase: PhaseDecode}}))
	st.End()
	for i, x := range h {
		require.False(t, math.IsInf(float64(x), 0) || math.IsNaN(float64(x)), "h[%d] = %g", i, x)
		require.LessOrEqual(t, math.Abs(float64(x)), 2*stepperMargin*MaxMagnitude, "h[%d]", i)
	}
	require.InEpsilon(t, 1.8e30, float64(h[1]), 1e-5)
	require.InEpsilon(t, 1.8e30, float64(h[d+1]), 1e-5)
	// The adds come first (1.8e30 along the direction too), then the clamps, global first:
	// the global's brings the projection to 1 (0 after float32 rounding at 1.8e30), and the
	// request's leaves it inside its bounds.
	require.LessOrEqual(t, math.Abs(float64(h[0])), 1e24)
	require.LessOrEqual(t, math.Abs(float64(h[d])), 1e24)
}
