package steer

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/internal/proto"
)

// Probe vectors: their own namespace (the fork's registry keeps probe and steer names apart),
// one site each, written from a worker through the owner, observed as ChangeProbe.
func TestProbeVectors(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	owner := newOwner(t, smallCfg, Options{})
	var changes []Change
	owner.OnChange(func(c Change) { changes = append(changes, c) })
	lb := loopback{}
	owner.Serve(func(op uint16, h func([]byte) ([]byte, error)) { lb[op] = h })
	w := newReader(t, owner, Options{Caller: lb})

	site := []Vector{{Hook: "post_block", Layer: 2, Scale: 1, Data: randVec(rng, smallCfg.Hidden)}}
	steerVec := []Vector{{Hook: "pre_attn", Layer: 0, Scale: 2, Data: randVec(rng, smallCfg.Hidden)}}
	pi, err := w.RegisterProbe("p", site)
	require.NoError(t, err)
	si, err := owner.Register("p", steerVec)
	require.NoError(t, err, "the same name as a steering vector is another entry")

	s, err := owner.Region().Snapshot()
	require.NoError(t, err)
	pv, err := owner.Probe(&s, "p")
	require.NoError(t, err)
	require.Equal(t, pi.Digest, pv.Digest)
	require.Equal(t, "post_block", pv.Vectors[0].Hook)
	require.Equal(t, site[0].Data, pv.Vectors[0].Data)
	sv, err := owner.Vector(&s, "p")
	require.NoError(t, err)
	require.Equal(t, si.Digest, sv.Digest)
	require.Equal(t, "pre_attn", sv.Vectors[0].Hook)
	probes, err := owner.ProbeInfos(&s)
	require.NoError(t, err)
	require.Equal(t, []VectorInfo{{Name: "p", Version: pi.Version, Digest: pi.Digest}}, probes)
	_, err = owner.Probe(&s, "q")
	require.ErrorIs(t, err, ErrUnknownVector)
	s.Close()

	checkProbeSiteRefused(t, rng, owner, w, lb, site, steerVec, pi.Digest)

	// A steering set cannot reference a probe: references resolve steering vectors only.
	_, err = owner.Unregister("p")
	require.NoError(t, err)
	_, err = owner.SetGlobal(Steering{Base: Tier{Refs: []Ref{{Name: "p", Strength: 1}}}})
	require.ErrorIs(t, err, ErrUnknownVector)

	uv, err := w.UnregisterProbe("p")
	require.NoError(t, err)
	_, err = w.UnregisterProbe("p")
	require.ErrorIs(t, err, ErrUnknownVector)
	_, err = owner.UnregisterProbe("p", Origin("mirror"))
	require.ErrorIs(t, err, ErrUnknownVector)
	_, err = w.UnregisterProbe("p", Origin("mirror"))
	require.ErrorIs(t, err, ErrNotOwner)

	var probeChanges []Change
	for _, c := range changes {
		if c.Kind == ChangeProbe {
			probeChanges = append(probeChanges, c)
		}
	}
	require.Equal(t, []Change{
		{Kind: ChangeProbe, Name: "p", Version: pi.Version},
		{Kind: ChangeProbe, Name: "p", Deleted: true, Version: uv},
	}, probeChanges)

	// Encoding serves the mirror: the probe's bytes under ChangeProbe.
	ri, err := owner.RegisterProbe("m", site, Origin("mirror"))
	require.NoError(t, err)
	s, err = owner.Region().Snapshot()
	require.NoError(t, err)
	defer s.Close()
	b, v, found, err := owner.Encoding(&s, ChangeProbe, "m")
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, ri.Version, v)
	st, d, err := DecodeSteering(b, smallCfg)
	require.NoError(t, err)
	require.Equal(t, ri.Digest, d)
	require.Len(t, st.Base.Vectors, 1)
	_, _, found, err = owner.Encoding(&s, ChangeVector, "m")
	require.NoError(t, err)
	require.False(t, found, "a probe is not a steering vector")

	for _, k := range []VectorKind{VectorSteer, VectorProbe} {
		got, ok := ParseVectorKind(k.String())
		require.True(t, ok)
		require.Equal(t, k, got)
	}
	_, ok := ParseVectorKind("gate")
	require.False(t, ok)
}

// checkProbeSiteRefused checks that a probe names exactly one site, checked in the worker w and
// again by the owner (through lb), and that a failed write changes nothing: probe "p" keeps
// digest.
func checkProbeSiteRefused(t *testing.T, rng *rand.Rand, owner *Owner, w *Worker, lb loopback, site, steerVec []Vector, digest Digest) {
	t.Helper()
	two := append(append([]Vector(nil), site...), steerVec...)
	_, err := w.RegisterProbe("p", two)
	require.ErrorIs(t, err, ErrProbeSite)
	req := []byte{1, 0, 'p'}
	enc, _, err := EncodeSteering(&Steering{Base: Tier{Vectors: two}}, smallCfg)
	require.NoError(t, err)
	_, err = lb[OpRegisterProbe](append(req, enc...))
	require.ErrorIs(t, err, ErrProbeSite)
	require.Equal(t, proto.CodeProbeSite, proto.CodeOf(err))
	_, err = w.RegisterProbe("p", nil)
	require.ErrorIs(t, err, ErrEmptySet)
	for name, tc := range badInputs(rng) {
		if len(tc.vecs) > 1 {
			continue // ErrProbeSite first
		}
		_, err := w.RegisterProbe("p", tc.vecs)
		require.ErrorIs(t, err, tc.err, name)
	}
	s, err := owner.Region().Snapshot()
	require.NoError(t, err)
	pv, err := owner.Probe(&s, "p")
	s.Close()
	require.NoError(t, err)
	require.Equal(t, digest, pv.Digest, "failed writes left the probe as it was")
}
