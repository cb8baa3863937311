package steer

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// What a request's gates can add is bounded as its steering is: an attenuation factor on its
// own steering, and adds summed over gates, each within MaxMagnitude alone, are refused at
// admission with ErrOverflow when their worst case is beyond it, and the refusal changes
// nothing.
func TestGatesBounded(t *testing.T) {
	e := newOwner(t, smallCfg, Options{})
	d := smallCfg.Hidden
	vec := func(x float32) []float32 {
		v := make([]float32, d)
		v[1] = x
		return v
	}
	_, err := e.Register("big", []Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: vec(9e29)}})
	require.NoError(t, err)
	big := &Steering{Decode: Tier{Vectors: []Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: vec(9e29)}}}}
	always := When{Kind: WhenAlways}
	atten := func(f float32) Gate {
		return Gate{When: always, Scope: ScopeRestOfRequest, Apply: GateApply{Kind: ApplyAttenuate, Strength: f}}
	}
	addBig := Gate{When: always, Scope: ScopeThisToken, Apply: GateApply{Kind: ApplyAdd, Steer: GateSource{Name: "big"}, Strength: 1}}
	v0 := e.Region().Version()

	_, err = e.Admit(Admission{RequestID: "r", Override: big, Gates: []Gate{atten(3e38)}})
	require.ErrorIs(t, err, ErrOverflow, "a factor of 3e38 on a 9e29 vector")
	require.Contains(t, err.Error(), "attenuate factor")

	many := make([]Gate, MaxGates)
	for i := range many {
		many[i] = addBig
	}
	_, err = e.Admit(Admission{RequestID: "r", Gates: many})
	require.ErrorIs(t, err, ErrOverflow, "64 adds of 9e29 sum to 5.76e31")

	_, err = e.Admit(Admission{RequestID: "r", Override: big, Gates: []Gate{addBig}})
	require.ErrorIs(t, err, ErrOverflow, "the request's steering plus one add of 9e29")

	// A rest_of_conversation gate refused leaves the conversation's table as it was.
	conv := ConvKey{Tenant: "t", ID: "c"}
	roc := atten(3e38)
	roc.Scope = ScopeRestOfConversation
	_, err = e.Admit(Admission{RequestID: "r", Conversation: conv, Override: big, Gates: []Gate{roc}})
	require.ErrorIs(t, err, ErrOverflow)
	_, err = e.Admit(Admission{RequestID: "r2", Conversation: conv})
	require.NoError(t, err)
	require.Nil(t, gatesAt(t, e, "r2"), "the refused gate was not carried")
	require.Equal(t, v0+1, e.Region().Version(), "the refusals published nothing")

	// Within the bound: accepted.
	_, err = e.Admit(Admission{RequestID: "ok", Override: big, Gates: []Gate{atten(1)}})
	require.NoError(t, err)
	_, err = e.Admit(Admission{RequestID: "ok2", Gates: []Gate{addBig, atten(0.5)}})
	require.NoError(t, err)
	_, err = e.Admit(Admission{RequestID: "ok3", Gates: []Gate{atten(1e9)}})
	require.NoError(t, err, "a factor on no steering adds nothing")
}

// A request owning several rows of one decode step in several spans (multi-token decode)
// with a this_token probe gate: each row gets the gate's add by its own probe read, on the
// Stepper as on the device path (a Batch), and as when the rows are one span. The firing row
// used to get nothing natively: the second span's read overwrote the first's.
func TestGatesThisTokenSeveralSpans(t *testing.T) {
	hook, err := smallCfg.Hook("post_block")
	require.NoError(t, err)
	d := smallCfg.Hidden
	e := gateTableEngine(t)
	gate := []Gate{{When: When{Kind: WhenProbe, Probe: GateSource{Name: "p"}, Threshold: 0.5, Sharpness: 100}, Scope: ScopeThisToken,
		Apply: GateApply{Kind: ApplyAdd, Steer: GateSource{Name: "s"}, Strength: 3}}}
	_, err = e.Admit(Admission{RequestID: "r", Gates: gate})
	require.NoError(t, err)
	h0 := []float32{0.9, 0.1}
	want := [3][2]float32{{0, 0}, {3, 0}, {3, 0}} // per layer, per row: dimension 1
	fill := func(h []float32) {
		for r, x := range h0 {
			h[r*d] = x
		}
	}
	two := []Span{{ID: "r", Start: 0, End: 1, Phase: PhaseDecode}, {ID: "r", Start: 1, End: 2, Phase: PhaseDecode}}
	one := []Span{{ID: "r", Start: 0, End: 2, Phase: PhaseDecode}}
	var sums []uint64
	for _, batch := range [][]Span{two, one} {
		native := e.NewStepper()
		require.NoError(t, native.Begin(0))
		for l := range 3 {
			h := make([]float32, 2*d)
			fill(h)
			require.NoError(t, native.Apply(hook, l, h, batch))
			for r := range 2 {
				require.InDelta(t, want[l][r], h[r*d+1], 1e-5, "native, %d spans: layer %d row %d", len(batch), l, r)
			}
		}
		native.End()
		sums = append(sums, native.GateChecksum())
		native.Close()

		st := e.NewStepper()
		b, err := st.NewBatch(BatchOptions{})
		require.NoError(t, err)
		dev, dg := newDevTables(d, 4), newDevGates(d, b.opt.MaxGateSlots)
		devStep(t, b, dev, dg, batch, 2, func(_, _ int, h []float32) { fill(h) },
			func(l, hk int, h []float32) {
				if HookID(hk) != hook {
					return
				}
				for r := range 2 {
					require.InDelta(t, want[l][r], h[r*d+1], 1e-5, "device, %d spans: layer %d row %d", len(batch), l, r)
				}
			})
		require.Equal(t, sums[len(sums)-1], st.GateChecksum(), "the same decisions")
		st.Close()
	}
}
