package steer

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// The gate semantics as tables. The model's forward is post_block at layers 0, 1, 2 (applied in
// that order); the probe "p" reads dimension 0 at (post_block, 1) (threshold 0.5, sharpness
// 100: a row with h[0] = 0.9 fires, 0.1 does not); the gate's add "s" writes dimension 1 at
// every layer; the request's own steering writes dimension 2 at every layer (its decode tier,
// plus its base tier for prefill rows). Each step gives every row's h[0]; want is, per layer
// and row, what was added to dimensions 1 and 2.

type gateStep struct {
	h0    []float32 // per row
	phase Phase     // PhaseDecode unless set
}

type added [2]float32 // dims 1 (the gate's add) and 2 (the request's steering)

// gateCase is one row of the gate tables: a request's gates, its steps, and per step, per
// layer and per row what was added to dimensions 1 and 2.
type gateCase struct {
	name  string
	gates []Gate
	steps []gateStep
	want  [][3][]added
}

func gateCases() []gateCase {
	probe := When{Kind: WhenProbe, Probe: GateSource{Name: "p"}, Threshold: 0.5, Sharpness: 100}
	always := When{Kind: WhenAlways}
	add := GateApply{Kind: ApplyAdd, Steer: GateSource{Name: "s"}, Strength: 2}
	atten := func(f float32) GateApply { return GateApply{Kind: ApplyAttenuate, Strength: f} }
	fire, quiet, mixed := []float32{0.9, 0.9}, []float32{0.1, 0.1}, []float32{0.9, 0.1}
	// rows: every layer adds the same per row
	same := func(rows ...added) [3][]added { return [3][]added{rows, rows, rows} }
	none := same(added{0, 1}, added{0, 1})
	steered := same(added{2, 1}, added{2, 1})
	return []gateCase{
		{"this_token probe: per row, from the probe's layer", []Gate{{When: probe, Scope: ScopeThisToken, Apply: add}},
			[]gateStep{{h0: mixed}, {h0: quiet}, {h0: fire}},
			[][3][]added{
				{{{0, 1}, {0, 1}}, {{2, 1}, {0, 1}}, {{2, 1}, {0, 1}}},
				none,
				{{{0, 1}, {0, 1}}, {{2, 1}, {2, 1}}, {{2, 1}, {2, 1}}},
			}},
		{"this_token always: every decode row", []Gate{{When: always, Scope: ScopeThisToken, Apply: add}},
			[]gateStep{{h0: quiet}, {h0: fire}}, [][3][]added{steered, steered}},
		{"next_step: a one-step pulse after it fired", []Gate{{When: probe, Scope: ScopeNextStep, Apply: add}},
			[]gateStep{{h0: quiet}, {h0: fire}, {h0: quiet}, {h0: quiet}, {h0: fire}, {h0: fire}, {h0: quiet}},
			[][3][]added{none, none, steered, none, none, steered, steered}},
		{"next_step: the row mean decides", []Gate{{When: probe, Scope: ScopeNextStep, Apply: add}},
			[]gateStep{{h0: []float32{0.9, 0.2}}, {h0: quiet}, {h0: []float32{0.7, 0.2}}, {h0: quiet}},
			[][3][]added{none, steered, none, none}},
		{"next_step always: from the second step", []Gate{{When: always, Scope: ScopeNextStep, Apply: add}},
			[]gateStep{{h0: quiet}, {h0: quiet}, {h0: quiet}}, [][3][]added{none, steered, steered}},
		{"rest_of_request: sticky", []Gate{{When: probe, Scope: ScopeRestOfRequest, Apply: add}},
			[]gateStep{{h0: quiet}, {h0: fire}, {h0: quiet}, {h0: quiet}},
			[][3][]added{none, none, steered, steered}},
		{"rest_of_conversation: sticky within the request", []Gate{{When: probe, Scope: ScopeRestOfConversation, Apply: add}},
			[]gateStep{{h0: fire}, {h0: quiet}, {h0: quiet}},
			[][3][]added{none, steered, steered}},
		{"prefill rows are never gated", []Gate{{When: always, Scope: ScopeThisToken, Apply: add}, {When: always, Scope: ScopeThisToken, Apply: atten(0)}},
			[]gateStep{{h0: fire, phase: PhasePrefill}, {h0: fire, phase: PhasePrefill}},
			[][3][]added{same(added{0, 3}, added{0, 3}), same(added{0, 3}, added{0, 3})}},
		{"attenuate with always this_token", []Gate{{When: always, Scope: ScopeThisToken, Apply: atten(0.25)}},
			[]gateStep{{h0: quiet}, {h0: fire}}, [][3][]added{same(added{0, 0.25}, added{0, 0.25}), same(added{0, 0.25}, added{0, 0.25})}},
		{"attenuate next_step, damping the add too", []Gate{{When: probe, Scope: ScopeNextStep, Apply: atten(0.5)}, {When: always, Scope: ScopeThisToken, Apply: add}},
			[]gateStep{{h0: fire}, {h0: quiet}, {h0: quiet}},
			[][3][]added{same(added{2, 1}, added{2, 1}), same(added{1, 0.5}, added{1, 0.5}), same(added{2, 1}, added{2, 1})}},
		{"attenuate rest_of_request to zero", []Gate{{When: probe, Scope: ScopeRestOfRequest, Apply: atten(0)}},
			[]gateStep{{h0: quiet}, {h0: fire}, {h0: quiet}},
			[][3][]added{none, none, same(added{0, 0}, added{0, 0})}},
		{"a negative attenuation is zero", []Gate{{When: always, Scope: ScopeThisToken, Apply: atten(-3)}},
			[]gateStep{{h0: quiet}}, [][3][]added{same(added{0, 0}, added{0, 0})}},
	}
}

func TestGateTables(t *testing.T) {
	cases := gateCases()
	for ci, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := gateTableEngine(t)
			id := fmt.Sprint("r", ci)
			_, err := e.Admit(Admission{RequestID: id, Override: gateTableSteering(), Gates: tc.gates})
			require.NoError(t, err)
			st := e.NewStepper()
			defer st.Close()
			for si, step := range tc.steps {
				got := runGateStep(t, st, id, step)
				for l := range 3 {
					for r := range got[l] {
						for k := range 2 {
							if math.Abs(float64(got[l][r][k]-tc.want[si][l][r][k])) > 1e-5 {
								t.Fatalf("step %d layer %d row %d: added %v, want %v", si, l, r, got[l], tc.want[si][l])
							}
						}
					}
				}
			}
		})
	}
}

func gateTableEngine(t testing.TB) *Owner {
	e := newOwner(t, smallCfg, Options{})
	unit := func(i int) []float32 {
		v := make([]float32, smallCfg.Hidden)
		v[i] = 1
		return v
	}
	_, err := e.RegisterProbe("p", []Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: unit(0)}})
	require.NoError(t, err)
	var s []Vector
	for l := range 3 {
		s = append(s, Vector{Hook: "post_block", Layer: l, Scale: 1, Data: unit(1)})
	}
	_, err = e.Register("s", s)
	require.NoError(t, err)
	return e
}

// gateTableSteering is the request's own steering: dimension 2 at every layer, 1 in decode
// rows (decode tier) and 3 in prefill rows (base 2 + prefill 1).
func gateTableSteering() *Steering {
	var st Steering
	for l := range 3 {
		v := make([]float32, smallCfg.Hidden)
		v[2] = 1
		st.Decode.Vectors = append(st.Decode.Vectors, Vector{Hook: "post_block", Layer: l, Scale: 1, Data: v})
		st.Prefill.Vectors = append(st.Prefill.Vectors, Vector{Hook: "post_block", Layer: l, Scale: 3, Data: v})
	}
	return &st
}

// runGateStep runs one step of rows h0 through layers 0..2 (a fresh block per layer with the
// same h[0]) and returns what each layer added to dimensions 1 and 2 of each row.
func runGateStep(t *testing.T, st *Stepper, id string, step gateStep) [3][]added {
	d := smallCfg.Hidden
	phase := step.phase
	if phase == 0 {
		phase = PhaseDecode
	}
	hook, err := smallCfg.Hook("post_block")
	require.NoError(t, err)
	require.NoError(t, st.Begin(0))
	var out [3][]added
	for l := range 3 {
		h := make([]float32, len(step.h0)*d)
		for r, x := range step.h0 {
			h[r*d] = x
		}
		require.NoError(t, st.Apply(hook, l, h, []Span{{ID: id, Start: 0, End: len(step.h0), Phase: phase}}))
		for r := range step.h0 {
			require.Equal(t, step.h0[r], h[r*d], "dimension 0 untouched")
			out[l] = append(out[l], added{h[r*d+1], h[r*d+2]})
		}
	}
	st.End()
	return out
}

// One request's firing row and another's quiet row in one batch, and an ungated request
// between them: gates are per request and per row.
func TestGatesBatchOfRequests(t *testing.T) {
	e := gateTableEngine(t)
	gate := []Gate{{When: When{Kind: WhenProbe, Probe: GateSource{Name: "p"}, Threshold: 0.5, Sharpness: 100}, Scope: ScopeThisToken,
		Apply: GateApply{Kind: ApplyAdd, Steer: GateSource{Name: "s"}, Strength: 1}}}
	for _, id := range []string{"a", "b"} {
		_, err := e.Admit(Admission{RequestID: id, Gates: gate})
		require.NoError(t, err)
	}
	_, err := e.Admit(Admission{RequestID: "plain"})
	require.NoError(t, err)
	d := smallCfg.Hidden
	hook, _ := smallCfg.Hook("post_block")
	st := e.NewStepper()
	defer st.Close()
	batch := []Span{{ID: "a", Start: 0, End: 1, Phase: PhaseDecode}, {ID: "plain", Start: 1, End: 2, Phase: PhaseDecode}, {ID: "b", Start: 2, End: 3, Phase: PhaseDecode}}
	require.NoError(t, st.Begin(0))
	var got [3][3]float32
	for l := range 3 {
		h := make([]float32, 3*d)
		h[0], h[d], h[2*d] = 0.9, 0.9, 0.1
		require.NoError(t, st.Apply(hook, l, h, batch))
		got[l] = [3]float32{h[1], h[d+1], h[2*d+1]}
	}
	sum := st.End()
	want := [3][3]float32{{0, 0, 0}, {1, 0, 0}, {1, 0, 0}}
	for l := range 3 {
		for r := range 3 {
			require.InDelta(t, want[l][r], got[l][r], 1e-6, "layer %d row %d (the quiet row's gate is sigmoid(-40))", l, r)
		}
	}
	require.Equal(t, uint64(2), st.Stats().GateEvaluations)
	require.Equal(t, uint64(1), st.Stats().GateFires)

	// Another Stepper (another rank) given the same rows gets the same checksum; other rows
	// give another one.
	run := func(h0b float32) uint64 {
		o := e.NewStepper()
		defer o.Close()
		require.NoError(t, o.Begin(0))
		for l := range 3 {
			h := make([]float32, 3*d)
			h[0], h[d], h[2*d] = 0.9, 0.9, h0b
			require.NoError(t, o.Apply(hook, l, h, batch))
		}
		return o.End()
	}
	require.Equal(t, sum, run(0.1))
	require.NotEqual(t, sum, run(0.9))
}

// A gated decode step allocates nothing once the Stepper has seen the request.
func TestGatedStepAllocs(t *testing.T) {
	e := gateTableEngine(t)
	gates := []Gate{
		{When: When{Kind: WhenProbe, Probe: GateSource{Name: "p"}, Threshold: 0.5, Sharpness: 100}, Scope: ScopeThisToken, Apply: GateApply{Kind: ApplyAdd, Steer: GateSource{Name: "s"}, Strength: 1}},
		{When: When{Kind: WhenProbe, Probe: GateSource{Name: "p"}, Threshold: 0.5, Sharpness: 100}, Scope: ScopeNextStep, Apply: GateApply{Kind: ApplyAttenuate, Strength: 0.5}},
		{Scope: ScopeRestOfRequest, Apply: GateApply{Kind: ApplyAdd, Steer: GateSource{Name: "s"}, Strength: 1}},
	}
	_, err := e.Admit(Admission{RequestID: "r", Override: gateTableSteering(), Gates: gates})
	require.NoError(t, err)
	d := smallCfg.Hidden
	hook, _ := smallCfg.Hook("post_block")
	st := e.NewStepper()
	defer st.Close()
	h := make([]float32, 4*d)
	batch := []Span{{ID: "r", Start: 0, End: 4, Phase: PhaseDecode}}
	step := func() {
		if err := st.Begin(0); err != nil {
			t.Fatal(err)
		}
		for l := range 3 {
			h[0], h[d], h[2*d], h[3*d] = 0.9, 0.1, 0.9, 0.1
			if err := st.Apply(hook, l, h, batch); err != nil {
				t.Fatal(err)
			}
		}
		st.End()
	}
	step()
	step()
	require.Zero(t, testing.AllocsPerRun(50, step))
	require.NotZero(t, st.Stats().GateFires)
}

// A re-admission (a new gate entry) resets the engaged state.
func TestGatesReadmissionResets(t *testing.T) {
	e := gateTableEngine(t)
	gates := []Gate{{When: When{Kind: WhenProbe, Probe: GateSource{Name: "p"}, Threshold: 0.5, Sharpness: 100}, Scope: ScopeRestOfRequest,
		Apply: GateApply{Kind: ApplyAdd, Steer: GateSource{Name: "s"}, Strength: 2}}}
	_, err := e.Admit(Admission{RequestID: "r", Override: gateTableSteering(), Gates: gates})
	require.NoError(t, err)
	st := e.NewStepper()
	defer st.Close()
	runGateStep(t, st, "r", gateStep{h0: []float32{0.9}})
	require.Equal(t, added{2, 1}, runGateStep(t, st, "r", gateStep{h0: []float32{0.1}})[2][0], "engaged")
	_, err = e.Admit(Admission{RequestID: "r", Override: gateTableSteering(), Gates: gates})
	require.NoError(t, err)
	require.Equal(t, added{0, 1}, runGateStep(t, st, "r", gateStep{h0: []float32{0.1}})[2][0], "reset by the re-admission")
	_, err = e.End("r")
	require.NoError(t, err)
	require.Equal(t, added{0, 0}, runGateStep(t, st, "r", gateStep{h0: []float32{0.9}})[2][0], "ended: nothing")
}

// rest_of_conversation is carried to the conversation's next request: engaged from its first
// step when it engaged before, still evaluated when it had not; dropped when the probe vector
// changes; another conversation is not affected.
func TestGatesRestOfConversation(t *testing.T) {
	e := gateTableEngine(t)
	conv := ConvKey{Tenant: "t", ID: "c"}
	gates := []Gate{{When: When{Kind: WhenProbe, Probe: GateSource{Name: "p"}, Threshold: 0.5, Sharpness: 100}, Scope: ScopeRestOfConversation,
		Apply: GateApply{Kind: ApplyAdd, Steer: GateSource{Name: "s"}, Strength: 2}}}
	st := e.NewStepper()
	defer st.Close()
	at := func(id string, h0 float32) added { return runGateStep(t, st, id, gateStep{h0: []float32{h0}})[2][0] }
	admit := func(id string, c ConvKey, g []Gate) {
		_, err := e.Admit(Admission{RequestID: id, Conversation: c, Override: gateTableSteering(), Gates: g})
		require.NoError(t, err)
	}
	admit("r1", conv, gates)
	require.Equal(t, added{0, 1}, at("r1", 0.1))
	require.Equal(t, added{0, 1}, at("r1", 0.9), "fired: from the next step")
	require.Equal(t, added{2, 1}, at("r1", 0.1))
	_, err := e.End("r1")
	require.NoError(t, err)

	admit("r2", conv, nil)
	require.Len(t, gatesAt(t, e, "r2"), 1, "carried onto the next request")
	require.Equal(t, added{2, 1}, at("r2", 0.1), "engaged from its first step")
	admit("other", ConvKey{Tenant: "t", ID: "d"}, nil)
	require.Nil(t, gatesAt(t, e, "other"))
	require.Equal(t, added{0, 1}, at("other", 0.1))

	// A new conversation's first request fires nothing; its next request carries the gate
	// unengaged, and it still fires there.
	conv2 := ConvKey{Tenant: "t", ID: "e"}
	admit("q1", conv2, gates)
	require.Equal(t, added{0, 1}, at("q1", 0.1))
	admit("q2", conv2, nil)
	require.Equal(t, added{0, 1}, at("q2", 0.1), "carried but never engaged")
	require.Equal(t, added{0, 1}, at("q2", 0.9))
	require.Equal(t, added{2, 1}, at("q2", 0.1), "fired in the carried request")

	// The probe changes: the carried gate is dropped at the next admission.
	unit := make([]float32, smallCfg.Hidden)
	unit[3] = 1
	_, err = e.RegisterProbe("p", []Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: unit}})
	require.NoError(t, err)
	admit("r3", conv, nil)
	require.Nil(t, gatesAt(t, e, "r3"), "dropped: the probe's digest changed")
	require.Equal(t, added{0, 1}, at("r3", 0.9))
}
