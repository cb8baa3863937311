package steer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// oracleCfg is the model of the executor's oracle tests: 5 hooks × 2 layers, hidden 16.
var oracleCfg = ModelConfig{Hidden: 16, Layers: 2}

// oracleIDs are the requests oracleEngine admits, then ids it does not.
var oracleIDs = []string{"c-0", "c-1", "c-2", "c-3", "one-site", "entry-a", "named", "plain",
	"g-probe", "g-always", "g-next", "g-rest", "g-atten", "unknown"}

// oracleEngine is an engine whose requests mix everything a step's program holds: requests in
// columns of the pool (one and two each, so runs form), one with a clamp, one steered at one
// site only, one in its entry (the pool is full), one referencing a named vector (read in
// place), an unsteered one, requests with gates of every scope (this_token probe adds, always
// adds, next_step and rest_of_request probes, an attenuation), and a global steering with a
// decode vector at some sites, a prefill vector at others and a clamp.
func oracleEngine(t testing.TB) *Owner {
	cfg := oracleCfg
	d := cfg.Hidden
	e := newOwnerColumns(t, cfg, 6)
	rng := rand.New(rand.NewPCG(9, 9))
	unit := func(i int) []float32 {
		v := make([]float32, d)
		v[i] = 1
		return v
	}
	_, err := e.RegisterProbe("p", []Vector{{Hook: "post_block", Layer: 0, Scale: 1, Data: unit(0)}})
	require.NoError(t, err)
	_, err = e.Register("s", []Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: randVec(rng, d)}, {Hook: "mlp_out", Layer: 0, Scale: 0.5, Data: randVec(rng, d)}})
	require.NoError(t, err)
	_, err = e.Register("named", []Vector{{Hook: "pre_attn", Layer: 1, Scale: 1, Data: randVec(rng, d)}, {Hook: "post_block", Layer: 0, Scale: 2, Data: randVec(rng, d)}})
	require.NoError(t, err)
	admit := func(id string, s *Steering, gates ...Gate) {
		t.Helper()
		_, err := e.Admit(Admission{RequestID: id, Override: s, Gates: gates})
		require.NoError(t, err)
	}
	for i, gen := range []int{0, 1, 2, 4} { // columns 0, 1-2, 3, 4
		s := colSteering(cfg, gen)
		if i == 2 {
			s.Base.Clamps = []Clamp{{Hook: "pre_attn", Layer: 1, Dir: unitVec(rng, d), Min: -1, Max: 1, Strength: 1}}
		}
		admit(fmt.Sprint("c-", i), s)
	}
	admit("one-site", &Steering{Decode: Tier{Vectors: []Vector{{Hook: cfg.HookName(1), Layer: 1, Scale: 1, Data: colVec(d, 7, 1, 1, PhaseDecode)}}}})
	admit("entry-a", colSteering(cfg, 6)) // the pool is full: in its entry
	admit("named", &Steering{Base: Tier{Refs: []Ref{{Name: "named", Strength: 1.5}}}})
	admit("plain", nil)
	probe := When{Kind: WhenProbe, Probe: GateSource{Name: "p"}, Threshold: 0.5, Sharpness: 8}
	add := GateApply{Kind: ApplyAdd, Steer: GateSource{Name: "s"}, Strength: 2}
	admit("g-probe", colSteering(cfg, 3), Gate{When: probe, Scope: ScopeThisToken, Apply: add})
	admit("g-always", nil, Gate{When: When{Kind: WhenAlways}, Scope: ScopeThisToken, Apply: add})
	admit("g-next", colSteering(cfg, 5), Gate{When: probe, Scope: ScopeNextStep, Apply: add})
	admit("g-rest", colSteering(cfg, 8), Gate{When: probe, Scope: ScopeRestOfRequest, Apply: GateApply{Kind: ApplyAttenuate, Strength: 0.5}})
	admit("g-atten", colSteering(cfg, 9), Gate{When: When{Kind: WhenAlways}, Scope: ScopeThisToken, Apply: GateApply{Kind: ApplyAttenuate, Strength: 0.25}})
	var g Steering
	g.Decode.Vectors = []Vector{{Hook: "post_attn", Layer: 0, Scale: 1, Data: randVec(rng, d)}, {Hook: "post_block", Layer: 1, Scale: 1, Data: randVec(rng, d)}}
	g.Prefill.Vectors = []Vector{{Hook: "mlp_in", Layer: 1, Scale: 1, Data: randVec(rng, d)}}
	g.Base.Clamps = []Clamp{{Hook: "mlp_out", Layer: 1, Dir: unitVec(rng, d), Min: -0.5, Max: 0.5, Strength: 1}}
	_, err = e.SetGlobal(g)
	require.NoError(t, err)
	return e
}

// oracleSteppers are the contenders: the program through Apply and through ApplyBound, and the
// old walk (oracleApply), each its own Stepper of one engine.
type oracleSteppers struct {
	apply, bound, oracle *Stepper
}

func newOracleSteppers(e *Owner) *oracleSteppers {
	return &oracleSteppers{e.NewStepper(), e.NewStepper(), e.NewStepper()}
}

func (o *oracleSteppers) close() { o.apply.Close(); o.bound.Close(); o.oracle.Close() }

// step runs one step of batch over h0 (rows × Hidden) at every site in model order, each
// contender carrying its own block from site to site (so probes read steered rows), and
// requires the same bits after each site, the same errors, and at the end the same checksum,
// gate checksum and counts.
func (o *oracleSteppers) step(t *testing.T, h0 []float32, batch []Span, what string) {
	t.Helper()
	cfg := oracleCfg
	rows := len(h0) / cfg.Hidden
	ha, hb, ho := slices.Clone(h0), slices.Clone(h0), slices.Clone(h0)
	require.NoError(t, o.apply.Begin(0))
	require.NoError(t, o.bound.Begin(0))
	require.NoError(t, o.oracle.Begin(0))
	errB := o.bound.Bind(batch, rows)
	for l := range cfg.Layers {
		for hk := range cfg.NumHooks() {
			errO := o.oracle.oracleApply(HookID(hk), l, ho, batch)
			errA := o.apply.Apply(HookID(hk), l, ha, batch)
			if errO != nil {
				require.Error(t, errA, "%s: the oracle refused: %v", what, errO)
				require.Error(t, errB, "%s: the oracle refused: %v", what, errO)
				require.Equal(t, h0, ha)
				o.apply.End()
				o.bound.End()
				o.oracle.End()
				return
			}
			require.NoError(t, errA, what)
			require.NoError(t, errB, what)
			require.NoError(t, o.bound.ApplyBound(HookID(hk), l, hb), what)
			requireBits(t, ho, ha, fmt.Sprintf("%s: Apply at %d/%d", what, hk, l))
			requireBits(t, ho, hb, fmt.Sprintf("%s: ApplyBound at %d/%d", what, hk, l))
		}
	}
	so, sa, sb := o.oracle.End(), o.apply.End(), o.bound.End()
	require.Equal(t, so, sa, "%s: checksum", what)
	require.Equal(t, so, sb, "%s: bound checksum", what)
	require.Equal(t, o.oracle.GateChecksum(), o.apply.GateChecksum(), what)
	require.Equal(t, o.oracle.GateChecksum(), o.bound.GateChecksum(), what)
	require.Equal(t, o.apply.Stats(), o.bound.Stats(), what)
	// The runs counted may differ from the old walk's: it ended a decode batch's run where it
	// handed the rest of the plan from its run walk to its general one (a vector not in the
	// pool), and the program's run goes on past such a span. The bits are the same.
	want, got := o.oracle.Stats(), o.apply.Stats()
	want.ColumnRuns, want.RunRows, got.ColumnRuns, got.RunRows = 0, 0, 0, 0
	require.Equal(t, want, got, what)
}

// requireBits fails unless got holds want's floats bit for bit.
func requireBits(t *testing.T, want, got []float32, what string) {
	t.Helper()
	for i := range want {
		if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
			require.Failf(t, "not the oracle's bits", "%s: element %d: %v, want %v", what, i, got[i], want[i])
		}
	}
}

// TestStepMatchesOracle steps batches that hold every kind of operation (runs, pairs with the
// global vector, clamps, gates of every scope, prefill spans, unknown and unsteered requests,
// rows out of order) through the program, by Apply and by ApplyBound, and through the old walk,
// twice each (the second step reuses the program), and requires the same bits, checksums and
// counts; then changes the state under them (a request re-admitted, the global steering
// changed) and steps again.
func TestStepMatchesOracle(t *testing.T) {
	e := oracleEngine(t)
	o := newOracleSteppers(e)
	defer o.close()
	d := oracleCfg.Hidden
	decode := func(ids ...string) []Span {
		var b []Span
		for i, id := range ids {
			b = append(b, Span{ID: id, Start: i, End: i + 1, Phase: PhaseDecode, Pos: 40})
		}
		return b
	}
	batches := [][]Span{
		decode("c-0", "c-1", "c-2", "c-3", "one-site", "entry-a", "named", "plain"),
		decode("c-0", "c-1", "g-probe", "c-3", "g-always", "g-next", "g-rest", "g-atten"),
		decode("g-atten", "c-3", "c-2", "c-1", "c-0", "unknown", "g-probe"),
		{{ID: "c-1", Start: 0, End: 3, Phase: PhasePrefill}, {ID: "g-probe", Start: 3, End: 5, Phase: PhaseDecode, Pos: 40},
			{ID: "named", Start: 5, End: 7, Phase: PhasePrefill}, {ID: "g-rest", Start: 7, End: 8, Phase: PhaseDecode, Pos: 40}},
		{{ID: "c-3", Start: 1, End: 2, Phase: PhasePrefill}, {ID: "c-0", Start: 0, End: 1, Phase: PhaseDecode}, {ID: "c-1", Start: 2, End: 2, Phase: PhaseDecode}},
		nil,
	}
	rng := rand.New(rand.NewPCG(7, 8))
	run := func(tag string) {
		for bi, batch := range batches {
			for rep := range 3 {
				h0 := randVec(rng, 8*d)
				for r := range 8 {
					h0[r*d] = float32(rng.IntN(3)) * 0.5 // the probe reads dimension 0
				}
				o.step(t, h0, batch, fmt.Sprintf("%s batch %d step %d", tag, bi, rep))
			}
		}
	}
	run("first")
	_, err := e.End("c-1")
	require.NoError(t, err)
	_, err = e.Admit(Admission{RequestID: "c-1", Override: colSteering(oracleCfg, 11)})
	require.NoError(t, err)
	run("c-1 re-admitted")
	_, err = e.SetGlobal(Steering{})
	require.NoError(t, err)
	run("no global")
	require.Positive(t, o.apply.Stats().ColumnRuns, "runs formed")
	require.Positive(t, o.apply.Stats().GateFires, "gates fired")
}

// TestStepMatchesOracleRandom steps random batches (half of them valid decode and prefill
// layouts of one-row spans in any order, the rest anything) through the program and the old
// walk, three steps each, on one set of Steppers whose gate states carry from step to step.
func TestStepMatchesOracleRandom(t *testing.T) {
	e := oracleEngine(t)
	o := newOracleSteppers(e)
	defer o.close()
	d := oracleCfg.Hidden
	rng := rand.New(rand.NewPCG(1, 2))
	for it := range 4000 {
		rows := rng.IntN(10)
		var batch []Span
		n := rng.IntN(12)
		for range n {
			start := rng.IntN(20) - 10
			batch = append(batch, Span{ID: oracleIDs[rng.IntN(len(oracleIDs))], Start: start, End: start + rng.IntN(5) - 1, Phase: Phase(rng.IntN(4)), Pos: 40})
		}
		if it%2 == 0 {
			batch = batch[:0]
			rows = 1 + rng.IntN(9)
			for r := range rows {
				if rng.IntN(5) == 0 {
					continue
				}
				batch = append(batch, Span{ID: oracleIDs[rng.IntN(len(oracleIDs))], Start: r, End: r + 1, Phase: Phase(1 + rng.IntN(2)), Pos: 40})
			}
			rng.Shuffle(len(batch), func(i, j int) { batch[i], batch[j] = batch[j], batch[i] })
		}
		for rep := range 3 {
			h0 := randVec(rng, rows*d)
			for r := range rows {
				h0[r*d] = float32(rng.IntN(3)) * 0.5
			}
			o.step(t, h0, batch, fmt.Sprintf("it %d step %d of %v", it, rep, batch))
			if t.Failed() {
				return
			}
		}
	}
}

// FuzzStepMatchesOracle decodes a batch (spans of oracleEngine's requests and unknown ids, any
// rows and phases: overlapping, out of range, empty, out of order), a block size and the rows'
// values from the input, and steps it three times through the program (Apply, ApplyBound) and
// the old walk (oracleApply): the same refusals, and otherwise the same bits after every site,
// the same checksums and the same counts.
func FuzzStepMatchesOracle(f *testing.F) {
	f.Add([]byte{8, 1, 0, 0, 2, 2, 1, 1, 2, 2, 8, 2, 2, 2, 3, 3, 2, 2})
	f.Add([]byte{8, 2, 9, 0, 4, 1, 8, 4, 2, 2, 6, 6, 2, 1, 11, 5, 2, 2})
	f.Add([]byte{3, 3, 0, 0, 1, 2, 1, 0, 2, 2})
	f.Add([]byte{6, 4, 12, 0, 2, 2, 10, 1, 2, 2, 9, 2, 2, 2, 11, 3, 2, 2, 8, 4, 3, 1})
	e := oracleEngine(f)
	o := newOracleSteppers(e)
	f.Cleanup(o.close)
	d := oracleCfg.Hidden
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < 2 {
			return
		}
		rows, seed := int(in[0]%10), uint64(in[1])
		var batch []Span
		for in = in[2:]; len(in) >= 4 && len(batch) < 12; in = in[4:] {
			start := int(int8(in[1])) % 10
			batch = append(batch, Span{ID: oracleIDs[int(in[0])%len(oracleIDs)], Start: start, End: start + int(in[2]%5) - 1, Phase: Phase(in[3] % 4), Pos: 40})
		}
		rng := rand.New(rand.NewPCG(seed, 1))
		for rep := range 3 {
			h0 := randVec(rng, rows*d)
			for r := range rows {
				h0[r*d] = float32(rng.IntN(3)) * 0.5
			}
			o.step(t, h0, batch, fmt.Sprintf("step %d of %v", rep, batch))
		}
	})
}
