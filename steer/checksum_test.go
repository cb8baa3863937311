package steer

import (
	"hash/fnv"
	"math/bits"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStepChecksumFormula recomputes a step's checksum from its definition, written out here
// independently of Apply's (which multiplies a span's fixed words once per batch): for every
// steered span of every Apply in order, the site, the request id's FNV-1a hash, the rows, the
// phase and the global's and the request's act words, each folded with xxhash's round. Ranks of
// different builds compare these values, so the formula must not drift.
func TestStepChecksumFormula(t *testing.T) {
	cfg := ModelConfig{Hidden: 24, Layers: 3}
	e := newOwner(t, cfg, Options{})
	rng := rand.New(rand.NewPCG(9, 10))
	vec := func(hook string, layer int) []Vector {
		return []Vector{{Hook: hook, Layer: layer, Scale: 1, Data: randVec(rng, cfg.Hidden)}}
	}
	_, err := e.SetGlobal(Steering{Decode: Tier{Vectors: vec("post_block", 1)}})
	require.NoError(t, err)
	ids := []string{"p", "q", "r"}
	for i, id := range ids {
		s := Steering{Base: Tier{Vectors: vec("post_block", i%cfg.Layers)}, Prefill: Tier{Vectors: vec("pre_attn", 2)}}
		_, err := e.Admit(Admission{RequestID: id, Override: &s})
		require.NoError(t, err)
	}
	_, err = e.Admit(Admission{RequestID: "u"}) // unsteered
	require.NoError(t, err)
	batch := []Span{
		{ID: "p", Start: 0, End: 2, Phase: PhasePrefill},
		{ID: "u", Start: 2, End: 3, Phase: PhaseDecode},
		{ID: "q", Start: 3, End: 4, Phase: PhaseDecode},
		{ID: "r", Start: 4, End: 4, Phase: PhaseDecode}, // empty: no term
		{ID: "r", Start: 5, End: 7, Phase: PhasePrefill},
	}
	st := e.NewStepper()
	defer st.Close()
	require.NoError(t, st.Begin(0))
	h := randVec(rng, 8*cfg.Hidden)
	snap, err := e.r.Snapshot()
	require.NoError(t, err)
	defer snap.Close()
	global, err := openComposed(&snap, cfg, e.pool, KindComposedGlobal, globalKey, KindGlobal)
	require.NoError(t, err)
	mix := func(h, x uint64) uint64 {
		h ^= x * 0x9E3779B97F4A7C15
		return bits.RotateLeft64(h, 31) * 0xC2B2AE3D27D4EB4F
	}
	var want uint64
	terms := 0
	for hk := range cfg.NumHooks() {
		for l := range cfg.Layers {
			require.NoError(t, st.Apply(HookID(hk), l, h, batch))
			ix := (hk*cfg.Layers + l) * 2
			for _, sp := range batch {
				if sp.Start == sp.End {
					continue
				}
				v, err := openComposed(&snap, cfg, e.pool, KindComposed, sp.ID, KindRequest)
				if err != nil {
					v = composedView{} // "u": admitted with nothing to compose
				}
				_, _, gAct := global.at(ix + int(sp.Phase) - 1)
				_, _, rAct := v.at(ix + int(sp.Phase) - 1)
				if gAct == 0 && rAct == 0 {
					continue
				}
				f := fnv.New64a()
				f.Write([]byte(sp.ID))
				x := mix(want, uint64(hk)<<32|uint64(l))
				x = mix(x, f.Sum64())
				x = mix(x, uint64(sp.Start)<<32|uint64(sp.End))
				x = mix(x, uint64(sp.Phase))
				x = mix(x, gAct)
				want = mix(x, rAct)
				terms++
			}
		}
	}
	require.GreaterOrEqual(t, terms, 6, "the scenario steers enough spans to test the formula")
	require.Equal(t, want, st.End())
}
