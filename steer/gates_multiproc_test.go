package steer

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/shm"
)

// Ranks agree on gates: each rank computes every probe score itself, from the same residual
// (the hidden states after the all-reduce are the same on every rank) with the same float64 dot
// in row order, so the same rows fire on every rank; no rank decides for the others. The step
// checksum folds each decision, so a rank that diverged is seen.

// gatedIDs are the requests gatedScenario admits.
var gatedIDs = []string{"g0", "g1", "g2", "g3", "g4", "g5", "g6", "g7"}

// gatedScenario registers a probe and a steering vector and admits gatedIDs with gates of every
// scope (and static steering), in the owner.
func gatedScenario(t *testing.T, e *Owner) {
	rng := rand.New(rand.NewPCG(40, 41))
	_, err := e.RegisterProbe("p", []Vector{{Hook: "post_attn", Layer: 1, Scale: 1, Data: randVec(rng, smallCfg.Hidden)}})
	require.NoError(t, err)
	var sv []Vector
	for l := range smallCfg.Layers {
		sv = append(sv, Vector{Hook: "post_block", Layer: l, Scale: 1, Data: randVec(rng, smallCfg.Hidden)})
	}
	_, err = e.Register("s", sv)
	require.NoError(t, err)
	probe := When{Kind: WhenProbe, Probe: GateSource{Name: "p"}, Threshold: 0, Sharpness: 3}
	add := GateApply{Kind: ApplyAdd, Steer: GateSource{Name: "s"}, Strength: 0.5}
	for i, id := range gatedIDs {
		gates := []Gate{{When: probe, Scope: GateScope(i % int(numScopes)), Apply: add}}
		if i%2 == 1 {
			gates = append(gates, Gate{When: probe, Scope: ScopeNextStep, Apply: GateApply{Kind: ApplyAttenuate, Strength: 0.25}})
		}
		_, err := e.Admit(Admission{RequestID: id, Conversation: ConvKey{Tenant: "t", ID: fmt.Sprint(i % 3)}, Override: gateTableSteering(), Gates: gates})
		require.NoError(t, err)
	}
}

// gatedSteps runs steps over pseudo-random hidden states (the same on every rank) and returns
// the step checksums, a hash of every output float and the gates fired.
func gatedSteps(e *Engine, steps int) ([]uint64, uint64, uint64, error) {
	rng := rand.New(rand.NewPCG(42, 43))
	cfg := e.Config()
	st := e.NewStepper()
	defer st.Close()
	fh := fnv.New64a()
	var sums []uint64
	const rows = 24
	for range steps {
		batch := batchFor(rng, gatedIDs, rows)
		if err := st.Begin(0); err != nil {
			return nil, 0, 0, err
		}
		for l := range cfg.Layers {
			for hi := range cfg.NumHooks() {
				h := randVec(rng, rows*cfg.Hidden)
				if err := st.Apply(HookID(hi), l, h, batch); err != nil {
					return nil, 0, 0, err
				}
				for _, f := range h {
					var b [4]byte
					le.PutUint32(b[:], math.Float32bits(f))
					fh.Write(b[:])
				}
			}
		}
		sums = append(sums, st.End())
	}
	return sums, fh.Sum64(), st.Stats().GateFires, nil
}

// gatesRankRun is a rank process: it attaches to the parent's region (fds 3 and 4) and runs
// gatedSteps.
func gatesRankRun() childResult {
	var r childResult
	reg, err := shm.Open(os.NewFile(3, "data"), os.NewFile(4, "readers"))
	if err != nil {
		r.ErrorMsg = err.Error()
		return r
	}
	defer reg.Close()
	e, err := Attach(reg, &smallCfg, Options{})
	if err != nil {
		r.ErrorMsg = err.Error()
		return r
	}
	r.Sums, r.Floats, r.Fires, err = gatedSteps(e.Engine, 12)
	if err != nil {
		r.ErrorMsg = err.Error()
	}
	return r
}

// TestGatesEqualAcrossRanks: three rank processes attached to the owner's region apply the
// same gated steps and get the owner's checksums, floats and fired gates exactly.
func TestGatesEqualAcrossRanks(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	e := newOwner(t, smallCfg, Options{})
	gatedScenario(t, e)
	want, wantFloats, fires, err := gatedSteps(e.Engine, 12)
	require.NoError(t, err)
	require.NotZero(t, fires)
	data, readers := e.Region().Files()
	for range 3 {
		r := runChild(t, "gates", nil, data, readers)
		require.Equal(t, want, r.Sums)
		require.Equal(t, wantFloats, r.Floats)
		require.Equal(t, fires, r.Fires)
	}
	for _, id := range gatedIDs {
		_, err := e.Admit(Admission{RequestID: id, Override: gateTableSteering()})
		require.NoError(t, err)
	}
	ungated, _, _, err := gatedSteps(e.Engine, 12)
	require.NoError(t, err)
	require.NotEqual(t, want, ungated, "the checksums fold the gates")
}
