package steer

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestResolveNativeChecksum steps random batches of gated requests (every scope, attenuation)
// and plain ones through two Steppers applying every site natively, one resolving each step
// with Resolve and the other with ResolveNative: the same batch checksum, version and outputs
// at every step, while the owner changes the global steering, ends a request and admits it
// again with other vectors, and the worker narrows its sites and widens them again.
func TestResolveNativeChecksum(t *testing.T) {
	e := newOwner(t, smallCfg, Options{})
	gatedScenario(t, e)
	cfg := e.Config()
	d := cfg.Hidden
	rng := rand.New(rand.NewPCG(3, 4))
	ids := append(slices.Clone(gatedIDs), "plain-0", "plain-1", "plain-2")
	for i, id := range ids[len(gatedIDs):] {
		_, err := e.Admit(Admission{RequestID: id, Override: &Steering{Decode: Tier{Vectors: []Vector{{Hook: "mlp_in", Layer: i % cfg.Layers, Scale: 1, Data: randVec(rng, d)}}}}})
		require.NoError(t, err)
	}
	full, nat := e.NewStepper(), e.NewStepper()
	defer full.Close()
	defer nat.Close()
	bf, err := full.NewBatch(BatchOptions{})
	require.NoError(t, err)
	bn, err := nat.NewBatch(BatchOptions{})
	require.NoError(t, err)
	changes := map[int]func(){
		3: func() {
			_, err := e.SetGlobal(Steering{Base: Tier{Vectors: []Vector{{Hook: "post_block", Layer: 1, Scale: 2, Data: randVec(rng, d)}}}})
			require.NoError(t, err)
		},
		6: func() {
			_, err := e.End("plain-1")
			require.NoError(t, err)
			_, err = e.Admit(Admission{RequestID: "plain-1", Override: &Steering{Decode: Tier{Vectors: []Vector{{Hook: "pre_attn", Layer: 0, Scale: 3, Data: randVec(rng, d)}}}}})
			require.NoError(t, err)
		},
		9: func() {
			sites := []int32{1, 4, int32(cfg.Layers) + 1}
			require.NoError(t, bf.SetSites(sites))
			require.NoError(t, bn.SetSites(sites))
		},
		12: func() {
			require.NoError(t, bf.SetSites(nil))
			require.NoError(t, bn.SetSites(nil))
			_, err := e.SetGlobal(Steering{})
			require.NoError(t, err)
		},
	}
	const rows = 32
	seen := map[uint64]bool{}
	for step := range 18 {
		if f := changes[step]; f != nil {
			f()
		}
		perm := slices.Clone(ids)
		rng.Shuffle(len(perm), func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
		batch := batchFor(rng, perm, rows)
		require.NoError(t, bf.Resolve(0, batch, rows))
		require.NoError(t, bn.ResolveNative(0, slices.Clone(batch), rows))
		require.Equal(t, bf.Version, bn.Version)
		require.Equal(t, bf.Checksum, bn.Checksum, "step %d", step)
		seen[bn.Checksum] = true
		for l := range cfg.Layers {
			for hk := range cfg.NumHooks() {
				h := randVec(rng, rows*d)
				h2 := slices.Clone(h)
				require.NoError(t, full.Apply(HookID(hk), l, h, batch))
				require.NoError(t, nat.Apply(HookID(hk), l, h2, batch))
				require.Equal(t, h, h2, "step %d site %d/%d", step, hk, l)
			}
		}
		require.Equal(t, full.End(), nat.End(), "step %d", step)
		require.Equal(t, full.GateChecksum(), nat.GateChecksum(), "step %d", step)
	}
	require.Greater(t, len(seen), 12, "the checksum follows the steps")
	require.Positive(t, full.Stats().GateFires, "the gates fired")
	require.Zero(t, bn.Stats().Updates, "no device rows staged")
}

// TestResolveNativeRefuses: what Resolve refuses ResolveNative refuses, and the step is ended.
func TestResolveNativeRefuses(t *testing.T) {
	e := newOwner(t, smallCfg, Options{})
	gatedScenario(t, e)
	st := e.NewStepper()
	defer st.Close()
	b, err := st.NewBatch(BatchOptions{})
	require.NoError(t, err)
	require.ErrorIs(t, b.ResolveNative(0, nil, -1), ErrShape)
	require.ErrorIs(t, b.ResolveNative(0, []Span{{ID: "g0", Start: 0, End: 3, Phase: PhaseDecode}}, 2), ErrBadBatch)
	require.ErrorIs(t, st.Apply(0, 0, make([]float32, smallCfg.Hidden), nil), ErrNoStep, "the refused step was ended")
	require.NoError(t, b.ResolveNative(0, []Span{{ID: "g0", Start: 0, End: 1, Phase: PhaseDecode}}, 1))
	require.NotZero(t, b.Checksum)
}
