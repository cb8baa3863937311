package steer

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

var fuzzCfg = ModelConfig{Hidden: 5, Layers: 2}

func FuzzDecodeRequestSteering(f *testing.F) {
	rng := rand.New(rand.NewPCG(1, 1))
	d := fuzzCfg.Hidden
	for _, s := range []Steering{
		{},
		{Base: Tier{Vectors: []Vector{{Hook: "pre_attn", Layer: 1, Scale: 2, Data: randVec(rng, d)}}}},
		{Compose: ComposeAdd, Decode: Tier{Refs: []Ref{{Name: "a", Strength: 1}, {Name: "bb", Strength: -1}}}},
		{Prefill: Tier{Clamps: []Clamp{{Hook: "mlp_out", Dir: unitVec(rng, d), Min: -1, Max: 1, Strength: 1}}},
			Base: Tier{Vectors: []Vector{{Hook: "mlp_in", Scale: 1, Data: randVec(rng, d)}}, Refs: []Ref{{Name: "x", Strength: 3}}}},
	} {
		b, _, err := EncodeSteering(&s, fuzzCfg)
		require.NoError(f, err)
		f.Add(b)
	}
	f.Add([]byte("SSTR"))
	f.Fuzz(func(t *testing.T, b []byte) {
		// Unverified decode (the worker path) must never fault, whatever the bytes.
		if w, err := decode(b, fuzzCfg, false); err == nil {
			for _, v := range w.vecs {
				require.Len(t, v.data, d)
				_ = v.data[d-1]
			}
			for _, c := range w.clamps {
				require.Len(t, c.dir, d)
			}
		}
		s, dg, err := DecodeSteering(b, fuzzCfg)
		if err != nil {
			require.ErrorIs(t, err, ErrBadEncoding)
			return
		}
		// Whatever verifies re-encodes to the same bytes (clamp directions are renormalized on
		// encode, so only sets without clamps are compared).
		if len(s.Base.Clamps)+len(s.Prefill.Clamps)+len(s.Decode.Clamps) > 0 {
			return
		}
		w, err := resolveSteering(fuzzCfg, &s, nil, true)
		if err != nil {
			return // e.g. a digest-consistent but hand-made set with refs of odd names
		}
		for i := range w.refs {
			w.refs[i].digest = mustWire(t, b).refs[i].digest
		}
		out, err := w.encode(d)
		require.NoError(t, err)
		require.True(t, bytes.Equal(b, out))
		require.Equal(t, dg, w.digest)
	})
}

func mustWire(t *testing.T, b []byte) wire {
	w, err := decode(b, fuzzCfg, true)
	require.NoError(t, err)
	return w
}
