package steer

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/shm"
)

// scenario registers named vectors, sets global tiers and admits a mix of requests with inline
// vectors, references, clamps (one ablation), phases, conversations and both compose modes,
// all from seed. It returns the reference model (with the admitted steering read back from the
// region) and the request ids.
func scenario(e *Owner, seed uint64) (*refModel, []string, error) {
	rng := rand.New(rand.NewPCG(seed, 1))
	cfg := e.Config()
	d := cfg.Hidden
	hooks := cfg.hooks()
	site := func() (string, int) { return hooks[rng.IntN(len(hooks))], rng.IntN(cfg.Layers) }
	m := &refModel{cfg: cfg, named: map[string][]Vector{}, reqs: map[string]Steering{}}
	for i := range 4 {
		var vecs []Vector
		seen := map[string]bool{}
		for range 1 + rng.IntN(4) {
			h, l := site()
			if seen[fmt.Sprint(h, l)] {
				continue
			}
			seen[fmt.Sprint(h, l)] = true
			vecs = append(vecs, Vector{Hook: h, Layer: l, Scale: float32(rng.Float64()), Data: randVec(rng, d)})
		}
		name := fmt.Sprint("vec-", i)
		if _, err := e.Register(name, vecs); err != nil {
			return nil, nil, err
		}
		m.named[name] = vecs
	}
	m.global = Steering{
		Base:    Tier{Vectors: []Vector{{Hook: hooks[0], Layer: 0, Scale: 0.25, Data: randVec(rng, d)}}},
		Decode:  Tier{Refs: []Ref{{Name: "vec-0", Strength: 0.5}}},
		Prefill: Tier{Clamps: []Clamp{{Hook: hooks[len(hooks)-1], Layer: cfg.Layers - 1, Dir: unitVec(rng, d), Min: -0.5, Max: 0.5, Strength: 1}}},
	}
	if _, err := e.SetGlobal(m.global); err != nil {
		return nil, nil, err
	}
	var ids []string
	for i := range 10 {
		id := fmt.Sprintf("req-%d-%d", seed, i)
		var s Steering
		tiers := []*Tier{&s.Base, &s.Prefill, &s.Decode}
		for _, t := range tiers {
			if rng.IntN(2) == 0 {
				h, l := site()
				t.Vectors = append(t.Vectors, Vector{Hook: h, Layer: l, Scale: float32(rng.NormFloat64()), Data: randVec(rng, d)})
			}
			if rng.IntN(2) == 0 {
				t.Refs = append(t.Refs, Ref{Name: fmt.Sprint("vec-", rng.IntN(4)), Strength: float32(rng.NormFloat64())})
			}
			if rng.IntN(3) == 0 {
				h, l := site()
				c := Clamp{Hook: h, Layer: l, Dir: unitVec(rng, d), Min: -1, Max: 1, Strength: float32(rng.Float64())}
				if rng.IntN(2) == 0 {
					c.Min, c.Max, c.Strength = 0, 0, 1 // ablation
				}
				t.Clamps = append(t.Clamps, c)
			}
		}
		if rng.IntN(2) == 0 {
			s.Compose = ComposeAdd
		}
		a := Admission{RequestID: id, Conversation: ConvKey{Tenant: "t", ID: fmt.Sprint(rng.IntN(3))}}
		switch rng.IntN(4) {
		case 0: // no override: bridge whatever the conversation latched
		case 1:
			a.Conversation = ConvKey{} // no conversation
			a.Override = &s
		default:
			a.Override = &s
		}
		if i == 9 {
			a = Admission{RequestID: id} // no steering of its own: global only
		}
		if _, err := e.Admit(a); err != nil {
			return nil, nil, err
		}
		snap, err := e.Region().Snapshot()
		if err != nil {
			return nil, nil, err
		}
		if b, _, err := snap.View(KindRequest, id); err == nil {
			got, _, err := DecodeSteering(b, cfg)
			if err != nil {
				snap.Close()
				return nil, nil, err
			}
			m.reqs[id] = cloneSteering(&got)
		}
		snap.Close()
		ids = append(ids, id)
	}
	return m, ids, nil
}

// batchFor lays out the requests over rows with random lengths and phases, leaving some rows
// unowned.
func batchFor(rng *rand.Rand, ids []string, rows int) []Span {
	var b []Span
	r := 0
	for _, id := range ids {
		n := 1 + rng.IntN(3)
		if r+n > rows {
			break
		}
		b = append(b, Span{ID: id, Start: r, End: r + n, Phase: Phase(1 + rng.IntN(2))})
		r += n + rng.IntN(2)
	}
	return b
}

// runSteps applies steps×layers×hooks to pseudo-random hidden states and returns the step
// checksums and a hash of every output float; version pins the snapshot (0: current).
func runSteps(e *Engine, seed uint64, ids []string, steps int, version uint64, check func(hook string, layer int, in, out []float32, batch []Span)) ([]uint64, uint64, error) {
	rng := rand.New(rand.NewPCG(seed, 2))
	cfg := e.Config()
	st := e.NewStepper()
	defer st.Close()
	fh := fnv.New64a()
	var sums []uint64
	const rows = 32
	for range steps {
		batch := batchFor(rng, ids, rows)
		if err := st.Begin(version); err != nil {
			return nil, 0, err
		}
		for l := range cfg.Layers {
			for hi, hook := range cfg.hooks() {
				h := randVec(rng, rows*cfg.Hidden)
				in := append([]float32(nil), h...)
				if err := st.Apply(HookID(hi), l, h, batch); err != nil {
					return nil, 0, err
				}
				if check != nil {
					check(hook, l, in, h, batch)
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
	return sums, fh.Sum64(), nil
}

func TestStepMatchesReference(t *testing.T) {
	e := newOwner(t, smallCfg, Options{})
	m, ids, err := scenario(e, 1)
	require.NoError(t, err)
	ids = append(ids, "unknown-request")
	checked := 0
	sums, _, err := runSteps(e.Engine, 1, ids, 5, 0, func(hook string, layer int, in, out []float32, batch []Span) {
		requireClose(t, m.apply(hook, layer, in, batch), out, fmt.Sprint(hook, layer))
		checked++
	})
	require.NoError(t, err)
	require.Equal(t, 5*3*5, checked)
	require.NotZero(t, sums[0])

	// A worker process would see the same: a reader engine gives identical floats and sums.
	rd := newReader(t, e, Options{})
	sums2, fh2, err := runSteps(rd.Engine, 1, ids, 5, 0, nil)
	require.NoError(t, err)
	_, fh1, err := runSteps(e.Engine, 1, ids, 5, 0, nil)
	require.NoError(t, err)
	require.Equal(t, sums, sums2)
	require.Equal(t, fh1, fh2)
}

func TestStepFollowsUpdates(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	e := newOwner(t, smallCfg, Options{})
	d := smallCfg.Hidden
	v1 := randVec(rng, d)
	_, err := e.Register("n", []Vector{{Hook: "pre_attn", Layer: 0, Scale: 1, Data: v1}})
	require.NoError(t, err)
	_, err = e.Admit(Admission{RequestID: "r", Override: &Steering{Base: Tier{Refs: []Ref{{Name: "n", Strength: 1}}}}})
	require.NoError(t, err)
	// Hold the version the old step reads, as a worker's open snapshot would: the owner's
	// background reclamation may otherwise reclaim it before that step begins.
	hold, err := e.Region().Snapshot()
	require.NoError(t, err)
	defer hold.Close()
	pinned := hold.Version()
	batch := []Span{{ID: "r", Start: 0, End: 1, Phase: PhaseDecode}}
	st := e.NewStepper()
	defer st.Close()
	apply := func(version uint64) ([]float32, uint64) {
		h := make([]float32, d)
		require.NoError(t, st.Begin(version))
		require.NoError(t, st.Apply(0, 0, h, batch))
		return h, st.End()
	}
	h, sum1 := apply(0)
	require.Equal(t, v1, h)

	// Re-register: the next step recomposes.
	v2 := randVec(rng, d)
	_, err = e.Register("n", []Vector{{Hook: "pre_attn", Layer: 0, Scale: 1, Data: v2}})
	require.NoError(t, err)
	h, sum2 := apply(0)
	require.Equal(t, v2, h)
	require.NotEqual(t, sum1, sum2)

	// A step pinned at the old version sees the old vector and the old checksum, reclamation
	// or not (the held snapshot keeps it).
	require.NoError(t, e.Region().Reclaim())
	h, sum := apply(pinned)
	require.Equal(t, v1, h)
	require.Equal(t, sum1, sum)

	// Unregister: the term no longer applies; End: the request has no steering.
	_, err = e.Unregister("n")
	require.NoError(t, err)
	h, sum = apply(0)
	require.Equal(t, make([]float32, d), h)
	require.Zero(t, sum)
	require.Equal(t, uint64(1), st.Stats().MissingRefs)

	// Global steering changes reach requests with and without their own entry.
	g := randVec(rng, d)
	_, err = e.SetGlobal(Steering{Decode: Tier{Vectors: []Vector{{Hook: "pre_attn", Layer: 0, Scale: 1, Data: g}}}})
	require.NoError(t, err)
	_, err = e.End("r")
	require.NoError(t, err)
	h, _ = apply(0)
	require.Equal(t, g, h)
	batch[0].Phase = PhasePrefill
	h, sum = apply(0)
	require.Equal(t, make([]float32, d), h, "decode tier only")
	require.Zero(t, sum)
}

func TestStepRejectsBadInput(t *testing.T) {
	e := newOwner(t, smallCfg, Options{})
	st := e.NewStepper()
	defer st.Close()
	h := make([]float32, 4*40)
	ok := []Span{{ID: "a", Start: 0, End: 4, Phase: PhasePrefill}}
	require.ErrorIs(t, st.Apply(0, 0, h, ok), ErrNoStep)
	require.NoError(t, st.Begin(0))
	defer st.End()
	cases := map[string]struct {
		hook  HookID
		layer int
		h     []float32
		batch []Span
		err   error
	}{
		"hook":       {5, 0, h, ok, ErrUnknownHook},
		"layer":      {0, 3, h, ok, ErrLayerRange},
		"layer -1":   {0, -1, h, ok, ErrLayerRange},
		"ragged":     {0, 0, h[:41], ok, ErrShape},
		"past end":   {0, 0, h, []Span{{ID: "a", Start: 2, End: 5, Phase: PhaseDecode}}, ErrBadBatch},
		"reversed":   {0, 0, h, []Span{{ID: "a", Start: 3, End: 2, Phase: PhaseDecode}}, ErrBadBatch},
		"negative":   {0, 0, h, []Span{{ID: "a", Start: -1, End: 2, Phase: PhaseDecode}}, ErrBadBatch},
		"no id":      {0, 0, h, []Span{{Start: 0, End: 2, Phase: PhaseDecode}}, ErrBadBatch},
		"phase base": {0, 0, h, []Span{{ID: "a", Start: 0, End: 2, Phase: PhaseBase}}, ErrBadBatch},
		"phase 7":    {0, 0, h, []Span{{ID: "a", Start: 0, End: 2, Phase: 7}}, ErrBadBatch},
	}
	for name, tc := range cases {
		require.ErrorIs(t, st.Apply(tc.hook, tc.layer, tc.h, tc.batch), tc.err, name)
	}
	require.NoError(t, st.Apply(0, 0, h, ok))
	_, err := e.Region().SnapshotAt(e.Region().Version() + 5)
	require.ErrorIs(t, err, shm.ErrSnapshotFuture)
	require.ErrorIs(t, st.Begin(e.Region().Version()+5), shm.ErrSnapshotFuture)
}

func TestStepZeroAllocSteadyState(t *testing.T) {
	e := newOwner(t, smallCfg, Options{})
	_, ids, err := scenario(e, 3)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(3, 3))
	batch := batchFor(rng, ids, 32)
	h := randVec(rng, 32*smallCfg.Hidden)
	st := e.NewStepper()
	defer st.Close()
	step := func() {
		if err := st.Begin(0); err != nil {
			panic(err)
		}
		for l := range smallCfg.Layers {
			for hk := range smallCfg.NumHooks() {
				if err := st.Apply(HookID(hk), l, h, batch); err != nil {
					panic(err)
				}
			}
		}
		st.End()
	}
	step()
	require.Zero(t, testing.AllocsPerRun(100, step))
}

// TestStepRequestAndGlobalOnePass checks the rounding of a row steered by both its request and
// the global steering: h + (r + g) in float32, bit for bit, whether its span has one row (one
// fused kernel) or several (the sum once, then one add per row), and on rows outside every
// span nothing changes.
func TestStepRequestAndGlobalOnePass(t *testing.T) {
	cfg := ModelConfig{Hidden: 4099, Layers: 1}
	e := newOwner(t, cfg, Options{})
	rng := rand.New(rand.NewPCG(41, 42))
	r, g := randVec(rng, cfg.Hidden), randVec(rng, cfg.Hidden)
	_, err := e.SetGlobal(Steering{Base: Tier{Vectors: []Vector{{Hook: "post_block", Layer: 0, Scale: 1, Data: g}}}})
	require.NoError(t, err)
	s := Steering{Base: Tier{Vectors: []Vector{{Hook: "post_block", Layer: 0, Scale: 1, Data: r}}}}
	for _, id := range []string{"one", "many"} {
		_, err := e.Admit(Admission{RequestID: id, Override: &s})
		require.NoError(t, err)
	}
	const rows = 8
	h0 := randVec(rng, rows*cfg.Hidden)
	h := append([]float32(nil), h0...)
	batch := []Span{{ID: "one", Start: 0, End: 1, Phase: PhaseDecode}, {ID: "many", Start: 2, End: 7, Phase: PhasePrefill}}
	st := e.NewStepper()
	defer st.Close()
	require.NoError(t, st.Begin(0))
	hook, err := cfg.Hook("post_block")
	require.NoError(t, err)
	require.NoError(t, st.Apply(hook, 0, h, batch))
	st.End()
	d := cfg.Hidden
	for row := range rows {
		steered := row == 0 || (row >= 2 && row < 7)
		for i := range d {
			want := h0[row*d+i]
			if steered {
				want += r[i] + g[i]
			}
			if math.Float32bits(want) != math.Float32bits(h[row*d+i]) {
				require.Failf(t, "wrong rounding", "row %d i %d: got %g, want h + (r + g) = %g (steered %v)", row, i, h[row*d+i], want, steered)
			}
		}
	}
}

// TestStepperSameVersion: a request read at the step's version is not looked up again, and
// stepping at another version (older, through a pin, or newer) reads what that version holds:
// the same-version shortcut keys on the region version, not on the step. An unknown request is
// still counted at every step.
func TestStepperSameVersion(t *testing.T) {
	d := smallCfg.Hidden
	e := newOwner(t, smallCfg, Options{})
	_, err := e.Register("n", []Vector{{Hook: "mlp_in", Layer: 2, Scale: 1, Data: filled(d, 1)}})
	require.NoError(t, err)
	s := Steering{Decode: Tier{Refs: []Ref{{Name: "n", Strength: 2}}}}
	_, err = e.Admit(Admission{RequestID: "r", Override: &s})
	require.NoError(t, err)
	batch := []Span{{ID: "r", Start: 0, End: 1, Phase: PhaseDecode}, {ID: "ghost", Start: 1, End: 2, Phase: PhaseDecode}}
	st := e.NewStepper()
	defer st.Close()
	h := make([]float32, 2*d)
	step := func(version uint64) float32 {
		t.Helper()
		clear(h)
		require.NoError(t, st.Begin(version))
		require.NoError(t, st.Apply(3, 2, h, batch))
		st.End()
		require.Zero(t, h[d], "the unknown request's row")
		return h[0]
	}
	v1 := e.Region().Version()
	old, err := e.Region().Snapshot() // keeps v1's data while newer versions are written
	require.NoError(t, err)
	defer old.Close()
	require.Equal(t, float32(2), step(0))
	require.Equal(t, float32(2), step(0))
	require.Equal(t, uint64(2), st.Stats().UnknownRequests, "counted at every step, same version or not")

	_, err = e.Register("n", []Vector{{Hook: "mlp_in", Layer: 2, Scale: 1, Data: filled(d, 10)}})
	require.NoError(t, err) // recomposes r in a new version
	v2 := e.Region().Version()
	require.Greater(t, v2, v1)
	for _, tc := range []struct {
		version uint64
		want    float32
	}{{0, 20}, {0, 20}, {v1, 2}, {v1, 2}, {v2, 20}, {v1, 2}, {0, 20}} {
		require.Equal(t, tc.want, step(tc.version), "step at version %d (v1 %d, v2 %d)", tc.version, v1, v2)
	}
	require.Equal(t, uint64(9), st.Stats().UnknownRequests)
}
