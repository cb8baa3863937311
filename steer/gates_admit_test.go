package steer

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/shm"
)

// gateFixture registers probe "p" at (post_block, 1) and steering vector "s" at pre_attn 2
// and post_block 2.
func gateFixture(t *testing.T) (*Owner, VectorInfo, VectorInfo) {
	rng := rand.New(rand.NewPCG(23, 1))
	e := newOwner(t, smallCfg, Options{})
	pi, err := e.RegisterProbe("p", []Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: randVec(rng, smallCfg.Hidden)}})
	require.NoError(t, err)
	si, err := e.Register("s", []Vector{
		{Hook: "pre_attn", Layer: 2, Scale: 1, Data: randVec(rng, smallCfg.Hidden)},
		{Hook: "post_block", Layer: 2, Scale: 0.5, Data: randVec(rng, smallCfg.Hidden)},
	})
	require.NoError(t, err)
	return e, pi, si
}

func gatesAt(t *testing.T, e *Owner, id string) []AdmittedGate {
	s, err := e.Region().Snapshot()
	require.NoError(t, err)
	defer s.Close()
	g, err := e.Gates(&s, id)
	require.NoError(t, err)
	for i := range g { // copy out of the snapshot
		g[i].Probe.Data = append([]float32(nil), g[i].Probe.Data...)
		for j := range g[i].Steer {
			g[i].Steer[j].Data = append([]float32(nil), g[i].Steer[j].Data...)
		}
	}
	return g
}

// Gates at admission: names resolve to the vectors registered then (digests included), inline
// sources are stored as given, End and a re-admission without gates remove them.
func TestAdmitGates(t *testing.T) {
	e, pi, si := gateFixture(t)
	inline := Vector{Hook: "mlp_out", Layer: 0, Scale: 1, Data: make([]float32, smallCfg.Hidden)}
	inline.Data[3] = 2
	gates := []Gate{
		{When: When{Kind: WhenProbe, Probe: GateSource{Name: "p"}, Threshold: 0.5, Sharpness: 4}, Scope: ScopeThisToken,
			Apply: GateApply{Kind: ApplyAdd, Steer: GateSource{Name: "s"}, Strength: 2}},
		{When: When{Kind: WhenProbe, Probe: GateSource{Vectors: []Vector{inline}}, Sharpness: 1}, Scope: ScopeNextStep,
			Apply: GateApply{Kind: ApplyAttenuate, Strength: 0.25}},
		{Scope: ScopeRestOfConversation, Apply: GateApply{Kind: ApplyAdd, Steer: GateSource{Vectors: []Vector{inline}}, Strength: 1}},
	}
	_, err := e.Admit(Admission{RequestID: "r", Gates: gates})
	require.NoError(t, err)
	got := gatesAt(t, e, "r")
	require.Len(t, got, 3)

	g := got[0]
	require.Equal(t, [3]uint8{uint8(WhenProbe), uint8(ScopeThisToken), uint8(ApplyAdd)}, [3]uint8{uint8(g.When), uint8(g.Scope), uint8(g.Apply)})
	require.Equal(t, [3]float32{0.5, 4, 2}, [3]float32{g.Threshold, g.Sharpness, g.Strength})
	require.Equal(t, "p", g.ProbeName)
	require.Equal(t, pi.Digest, g.ProbeDigest, "the probe's digest is the registered one")
	require.Equal(t, "post_block", g.Probe.Hook)
	require.Equal(t, 1, g.Probe.Layer)
	require.Equal(t, "s", g.SteerName)
	require.Equal(t, si.Digest, g.SteerDigest)
	require.Len(t, g.Steer, 2)
	require.Equal(t, float32(0.5), g.Steer[1].Scale, "the add's vectors keep their scale; Strength is apart")

	g = got[1]
	require.Equal(t, ApplyAttenuate, g.Apply)
	require.Equal(t, "", g.ProbeName)
	require.Equal(t, inline.Data, g.Probe.Data)
	require.Nil(t, g.Steer)
	require.Equal(t, ScopeRestOfConversation, got[2].Scope)
	require.Equal(t, WhenAlways, got[2].When)
	require.Equal(t, inline.Data, got[2].Steer[0].Data)

	// The stored entry verifies (digest over the whole encoding).
	s, err := e.Region().Snapshot()
	require.NoError(t, err)
	b, _, err := s.View(KindGates, "r")
	require.NoError(t, err)
	_, err = decodeGateEntry(b, smallCfg, true)
	require.NoError(t, err)
	s.Close()

	_, err = e.Admit(Admission{RequestID: "r"})
	require.NoError(t, err)
	require.Nil(t, gatesAt(t, e, "r"), "re-admitted without gates")
	_, err = e.Admit(Admission{RequestID: "r", Gates: gates[:1]})
	require.NoError(t, err)
	require.Len(t, gatesAt(t, e, "r"), 1)
	_, err = e.End("r")
	require.NoError(t, err)
	require.Nil(t, gatesAt(t, e, "r"), "ended")
}

// Every refusal at admission is typed and changes nothing: not the request's entries, not the
// region's version.
func TestAdmitGatesRefused(t *testing.T) {
	e, _, _ := gateFixture(t)
	vec := func(hook string, layer, width int, f float32) Vector {
		d := make([]float32, width)
		d[0] = f
		return Vector{Hook: hook, Layer: layer, Scale: 1, Data: d}
	}
	add := GateApply{Kind: ApplyAdd, Steer: GateSource{Name: "s"}, Strength: 1}
	probe := func(src GateSource) When { return When{Kind: WhenProbe, Probe: src, Sharpness: 1} }
	cases := []struct {
		name string
		g    Gate
		want error
	}{
		{"unknown probe name", Gate{When: probe(GateSource{Name: "nope"}), Apply: add}, ErrUnknownVector},
		{"a steering vector is not a probe", Gate{When: probe(GateSource{Name: "s"}), Apply: add}, ErrUnknownVector},
		{"a probe is not a steering vector", Gate{Apply: GateApply{Kind: ApplyAdd, Steer: GateSource{Name: "p"}}}, ErrUnknownVector},
		{"inline probe of two sites", Gate{When: probe(GateSource{Vectors: []Vector{vec("post_block", 0, 40, 1), vec("post_block", 1, 40, 1)}}), Apply: add}, ErrProbeSite},
		{"inline probe of the wrong width", Gate{When: probe(GateSource{Vectors: []Vector{vec("post_block", 0, 39, 1)}}), Apply: add}, ErrHiddenSize},
		{"inline probe at an unknown hook", Gate{When: probe(GateSource{Vectors: []Vector{vec("attn", 0, 40, 1)}}), Apply: add}, ErrUnknownHook},
		{"inline add beyond the layers", Gate{Apply: GateApply{Kind: ApplyAdd, Steer: GateSource{Vectors: []Vector{vec("post_block", 3, 40, 1)}}}}, ErrLayerRange},
		{"inline add twice at a site", Gate{Apply: GateApply{Kind: ApplyAdd, Steer: GateSource{Vectors: []Vector{vec("post_block", 0, 40, 1), vec("post_block", 0, 40, 1)}}}}, ErrDuplicate},
		{"add strength beyond MaxMagnitude", Gate{Apply: GateApply{Kind: ApplyAdd, Steer: GateSource{Vectors: []Vector{vec("post_block", 0, 40, 1e20)}}, Strength: 1e20}}, ErrOverflow},
		{"add without vectors", Gate{Apply: GateApply{Kind: ApplyAdd}}, ErrBadGate},
		{"attenuate probe this_token", Gate{When: probe(GateSource{Name: "p"}), Apply: GateApply{Kind: ApplyAttenuate, Strength: 0.5}}, ErrGateUnsupported},
		{"negative sharpness", Gate{When: When{Kind: WhenProbe, Probe: GateSource{Name: "p"}, Sharpness: -1}, Apply: add}, ErrBadGate},
	}
	_, err := e.Admit(Admission{RequestID: "kept", Override: &Steering{Decode: Tier{Refs: []Ref{{Name: "s", Strength: 1}}}}})
	require.NoError(t, err)
	kept := gatesAt(t, e, "kept")
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := e.Region().Version()
			ok := Gate{Scope: ScopeNextStep, Apply: add}
			s, err := e.Region().Snapshot()
			require.NoError(t, err)
			defer s.Close()
			for _, id := range []string{"new", "kept"} {
				_, err := e.Admit(Admission{RequestID: id, Gates: []Gate{ok, tc.g}})
				require.ErrorIs(t, err, tc.want)
				require.Contains(t, err.Error(), `request "`+id+`"`)
				// CheckGatesAt refuses it with the admission's error, text and all.
				checked := e.CheckGatesAt(&s, []Gate{ok, tc.g}, `request "`+id+`"`)
				require.ErrorIs(t, checked, tc.want)
				require.Equal(t, err.Error(), checked.Error())
			}
			checked := e.CheckGatesAt(&s, []Gate{ok, tc.g}, "") // no request named
			require.ErrorIs(t, checked, tc.want)
			require.NotContains(t, checked.Error(), `request "`)
			require.Contains(t, checked.Error(), "steering[1]")
			require.Equal(t, v, e.Region().Version(), "nothing written")
			_, _, err = s.View(KindRequest, "new")
			require.ErrorIs(t, err, shm.ErrNotFound)
			_, _, err = s.View(KindRequest, "kept")
			require.NoError(t, err)
			require.Equal(t, kept, gatesAt(t, e, "kept"))
		})
	}
	many := make([]Gate, MaxGates+1)
	for i := range many {
		many[i] = Gate{Scope: ScopeNextStep, Apply: add}
	}
	_, err = e.Admit(Admission{RequestID: "new", Gates: many})
	require.ErrorIs(t, err, ErrBadGate)
	s, err := e.Region().Snapshot()
	require.NoError(t, err)
	defer s.Close()
	require.ErrorIs(t, e.CheckGatesAt(&s, many, ""), ErrBadGate)
	require.NoError(t, e.CheckGatesAt(&s, many[:MaxGates], ""), "what an admission accepts")
	require.NoError(t, e.CheckGatesAt(&s, nil, ""))
}

// FuzzDecodeGateEntry: region bytes never crash the decoder, and what decodes is in range.
func FuzzDecodeGateEntry(f *testing.F) {
	rng := rand.New(rand.NewPCG(1, 2))
	probe, _, err := EncodeSteering(&Steering{Base: Tier{Vectors: []Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: randVec(rng, smallCfg.Hidden)}}}}, smallCfg)
	if err != nil {
		f.Fatal(err)
	}
	g := Gate{When: When{Kind: WhenProbe, Threshold: 1, Sharpness: 2}, Scope: ScopeRestOfRequest, Apply: GateApply{Kind: ApplyAdd, Strength: 3}}
	f.Add(encodeGates([]resolvedGate{{g: &g, probeName: "p", steerName: "s", probeWire: probe, steerWire: probe}}, smallCfg.Hidden, 0))
	a := Gate{Apply: GateApply{Kind: ApplyAttenuate, Strength: 0.5}}
	f.Add(encodeGates([]resolvedGate{{g: &a}}, smallCfg.Hidden, 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		gs, err := decodeGateEntry(b, smallCfg, false)
		if err != nil {
			if !errors.Is(err, ErrBadEncoding) {
				t.Fatalf("untyped: %v", err)
			}
			return
		}
		for _, g := range gs {
			if g.Scope >= numScopes || g.When > WhenProbe || g.Apply > ApplyAttenuate {
				t.Fatalf("kinds out of range: %+v", g)
			}
			if g.When == WhenProbe && len(g.Probe.Data) != smallCfg.Hidden {
				t.Fatal("probe of the wrong width")
			}
		}
	})
}
