package steer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// devGates is what a device worker keeps for the gates (batch_gates.go): the gate slots' probe
// rows and parameters, per site their add rows, and per step the gate and score buffers. It
// computes in float32, as the Python device path does.
type devGates struct {
	d, maxSlots  int
	probe        [][]float32
	site         []int32
	perRow       []bool
	thr, sharp   []float32
	adds         map[int32][][]float32
	gate, score  []float32
	cols, rows   int
	rowsOf       []int32
	factor       []float32
	addUploads   int
	probeUploads int
}

func newDevGates(d, maxSlots int) *devGates {
	g := &devGates{d: d, maxSlots: maxSlots, adds: map[int32][][]float32{}}
	g.probe = make([][]float32, maxSlots+1)
	for i := range g.probe {
		g.probe[i] = make([]float32, d)
	}
	g.site = make([]int32, maxSlots+1)
	g.perRow = make([]bool, maxSlots+1)
	g.thr = make([]float32, maxSlots+1)
	g.sharp = make([]float32, maxSlots+1)
	return g
}

// begin writes a resolve's gate updates and starts the step's buffers.
func (g *devGates) begin(b *Batch, rows int) {
	d := g.d
	gt := &b.Gates
	for i, u := range gt.Updates {
		copy(g.probe[u.Slot], gt.Probe[i*d:(i+1)*d])
		g.site[u.Slot], g.perRow[u.Slot] = u.ProbeSite, u.PerRow == 1
		g.thr[u.Slot], g.sharp[u.Slot] = gt.Params[2*i], gt.Params[2*i+1]
		g.probeUploads++
	}
	for i, u := range gt.Adds {
		tb := g.adds[u.Site]
		if tb == nil {
			tb = make([][]float32, g.maxSlots+1)
			for j := range tb {
				tb[j] = make([]float32, d)
			}
			g.adds[u.Site] = tb
		}
		copy(tb[u.Slot], gt.AddStage[i*d:(i+1)*d])
		g.addUploads++
	}
	g.cols, g.rows = gt.Cols, rows
	g.rowsOf = append(g.rowsOf[:0], gt.Rows...)
	g.factor = append(g.factor[:0], gt.Factor...)
	g.gate = make([]float32, rows*gt.Cols)
	g.score = make([]float32, rows*gt.Cols)
}

// probeAt reads the probes of site (before its steering).
func (g *devGates) probeAt(site int32, h []float32) {
	d := g.d
	for t := range g.rows {
		for k := range g.cols {
			j := g.rowsOf[t*g.cols+k]
			if j == 0 || g.site[j] != site {
				continue
			}
			var s float32
			for i, x := range h[t*d : (t+1)*d] {
				s += x * g.probe[j][i]
			}
			g.score[t*g.cols+k] = s
			if g.perRow[j] {
				g.gate[t*g.cols+k] = g.factor[t*g.cols+k] * float32(1/(1+math.Exp(-float64(g.sharp[j]*(s-g.thr[j])))))
			}
		}
	}
}

// addAt adds the gated rows at site (after its steering).
func (g *devGates) addAt(site int32, h []float32) {
	tb := g.adds[site]
	if tb == nil {
		return
	}
	d := g.d
	for t := range g.rows {
		for k := range g.cols {
			j := g.rowsOf[t*g.cols+k]
			w := g.gate[t*g.cols+k]
			for i, a := range tb[j] {
				h[t*d+i] += w * a
			}
		}
	}
}

// devStep is one device-path step of a batch: resolve, upload, then per site (in forward
// order, layer-major) the probe reads, the gather-add and the gated adds, then Report. fill
// writes the input rows of a site.
func devStep(t testing.TB, b *Batch, dev *devTables, dg *devGates, batch []Span, rows int, fill func(layer, hook int, h []float32), out func(layer, hook int, h []float32)) {
	st := b.s
	cfg := st.e.cfg
	d := cfg.Hidden
	require.NoError(t, b.Resolve(0, batch, rows))
	st.End()
	dev.update(b)
	dg.begin(b, rows)
	for l := range cfg.Layers {
		for hk := range cfg.NumHooks() {
			site := int32(hk*cfg.Layers + l)
			h := make([]float32, rows*d)
			fill(l, hk, h)
			dg.probeAt(site, h)
			dev.apply(b, site, h)
			dg.addAt(site, h)
			out(l, hk, h)
		}
	}
	if b.gate.awaiting {
		require.NoError(t, b.Report(dg.score))
	}
}

// The gate tables through the device path: the same rows steered as by the Stepper, the same
// decisions (GateChecksum) and counts.
func TestBatchGateTables(t *testing.T) {
	hook, err := smallCfg.Hook("post_block")
	require.NoError(t, err)
	for ci, tc := range gateCases() {
		t.Run(tc.name, func(t *testing.T) {
			e := gateTableEngine(t)
			id := fmt.Sprint("r", ci)
			_, err := e.Admit(Admission{RequestID: id, Override: gateTableSteering(), Gates: tc.gates})
			require.NoError(t, err)
			native := e.NewStepper()
			defer native.Close()
			st := e.NewStepper()
			defer st.Close()
			b, err := st.NewBatch(BatchOptions{})
			require.NoError(t, err)
			d := smallCfg.Hidden
			dev, dg := newDevTables(d, 4), newDevGates(d, b.opt.MaxGateSlots)
			for si, step := range tc.steps {
				runGateStep(t, native, id, step)
				phase := step.phase
				if phase == 0 {
					phase = PhaseDecode
				}
				rows := len(step.h0)
				var got [3][]added
				devStep(t, b, dev, dg, []Span{{ID: id, Start: 0, End: rows, Phase: phase}}, rows,
					func(_, _ int, h []float32) {
						for r, x := range step.h0 {
							h[r*d] = x
						}
					},
					func(l, hk int, h []float32) {
						if HookID(hk) != hook {
							return
						}
						for r := range rows {
							got[l] = append(got[l], added{h[r*d+1], h[r*d+2]})
						}
					})
				for l := range 3 {
					for r := range got[l] {
						for k := range 2 {
							if math.Abs(float64(got[l][r][k]-tc.want[si][l][r][k])) > 1e-5 {
								t.Fatalf("step %d layer %d row %d: added %v, want %v", si, l, r, got[l], tc.want[si][l])
							}
						}
					}
				}
				require.Equal(t, native.GateChecksum(), st.GateChecksum(), "step %d: the same decisions", si)
			}
			require.Equal(t, native.Stats().GateScopes, st.Stats().GateScopes)
			require.Equal(t, native.Stats().GateFires, st.Stats().GateFires)
			require.Zero(t, st.Stats().GateReportsMissed)
		})
	}
}

// Every scope and apply over random hidden states and random batches (the multi-rank
// scenario): the device path's outputs are within float32 rounding of the Stepper's, its
// decisions and counts are the same, step after step.
func TestBatchGatesMatchStepper(t *testing.T) {
	e := newOwner(t, smallCfg, Options{})
	gatedScenario(t, e)
	cfg := e.Config()
	d := cfg.Hidden
	native := e.NewStepper()
	defer native.Close()
	st := e.NewStepper()
	defer st.Close()
	b, err := st.NewBatch(BatchOptions{})
	require.NoError(t, err)
	dev, dg := newDevTables(d, 4), newDevGates(d, b.opt.MaxGateSlots)
	rng := rand.New(rand.NewPCG(7, 8))
	const rows = 24
	fires := uint64(0)
	for step := range 16 {
		batch := batchFor(rng, gatedIDs, rows)
		inputs := map[[2]int][]float32{}
		for l := range cfg.Layers {
			for hk := range cfg.NumHooks() {
				inputs[[2]int{l, hk}] = randVec(rng, rows*d)
			}
		}
		want := map[[2]int][]float32{}
		require.NoError(t, native.Begin(0))
		for l := range cfg.Layers {
			for hk := range cfg.NumHooks() {
				h := append([]float32(nil), inputs[[2]int{l, hk}]...)
				require.NoError(t, native.Apply(HookID(hk), l, h, batch))
				want[[2]int{l, hk}] = h
			}
		}
		native.End()
		devStep(t, b, dev, dg, batch, rows,
			func(l, hk int, h []float32) { copy(h, inputs[[2]int{l, hk}]) },
			func(l, hk int, h []float32) {
				w := want[[2]int{l, hk}]
				for i := range h {
					require.InDelta(t, w[i], h[i], 1e-4*(1+math.Abs(float64(w[i]))), "step %d layer %d hook %d element %d", step, l, hk, i)
				}
			})
		require.Equal(t, native.GateChecksum(), st.GateChecksum(), "step %d", step)
		require.Equal(t, native.Stats().GateScopes, st.Stats().GateScopes, "step %d", step)
		fires = native.Stats().GateFires
	}
	require.NotZero(t, fires)
	for sc := range 4 {
		require.NotZero(t, native.Stats().GateScopes[sc].Evaluations, "scope %s evaluated", GateScope(sc))
	}
}

// A steady gated batch uploads nothing after its first step, and its resolve allocates
// nothing; requests with the same gate share one gate slot.
func TestBatchGatesSteady(t *testing.T) {
	e := gateTableEngine(t)
	gate := []Gate{{When: When{Kind: WhenProbe, Probe: GateSource{Name: "p"}, Threshold: 0.5, Sharpness: 100}, Scope: ScopeThisToken,
		Apply: GateApply{Kind: ApplyAdd, Steer: GateSource{Name: "s"}, Strength: 1}}}
	var batch []Span
	for i := range 8 {
		id := fmt.Sprint("q", i)
		_, err := e.Admit(Admission{RequestID: id, Override: gateTableSteering(), Gates: gate})
		require.NoError(t, err)
		batch = append(batch, Span{ID: id, Start: i, End: i + 1, Phase: PhaseDecode})
	}
	st := e.NewStepper()
	defer st.Close()
	b, err := st.NewBatch(BatchOptions{})
	require.NoError(t, err)
	scores := make([]float32, 8)
	step := func() {
		if err := b.Resolve(0, batch, 8); err != nil {
			t.Fatal(err)
		}
		st.End()
		if err := b.Report(scores); err != nil {
			t.Fatal(err)
		}
	}
	step()
	require.Equal(t, 1, b.Gates.Cols)
	require.Len(t, b.Gates.Updates, 1, "one gate slot shared by the 8 requests")
	require.Len(t, b.Gates.Adds, 3, "its add rows at post_block 0, 1, 2")
	hook, _ := smallCfg.Hook("post_block")
	ps := int32(hook) * int32(smallCfg.Layers)
	require.Equal(t, []int32{ps, ps + 1, ps + 2}, b.Gates.Sites, "the probe's site and the add's")
	step()
	require.Empty(t, b.Gates.Updates)
	require.Empty(t, b.Gates.Adds)
	require.Empty(t, b.Updates)
	require.Zero(t, testing.AllocsPerRun(50, step))
	require.Equal(t, uint64(8*53), st.Stats().GateEvaluations)
}

// Report's refusals change nothing; a step never reported counts, and its probes did not fire.
func TestBatchGatesReport(t *testing.T) {
	e := gateTableEngine(t)
	_, err := e.Admit(Admission{RequestID: "r", Override: gateTableSteering(), Gates: []Gate{{When: When{Kind: WhenProbe, Probe: GateSource{Name: "p"}, Threshold: 0.5, Sharpness: 100},
		Scope: ScopeRestOfRequest, Apply: GateApply{Kind: ApplyAdd, Steer: GateSource{Name: "s"}, Strength: 2}}}})
	require.NoError(t, err)
	st := e.NewStepper()
	defer st.Close()
	b, err := st.NewBatch(BatchOptions{})
	require.NoError(t, err)
	require.ErrorIs(t, b.Report(nil), ErrNoStep)
	batch := []Span{{ID: "r", Start: 0, End: 2, Phase: PhaseDecode}}
	require.NoError(t, b.Resolve(0, batch, 2))
	require.ErrorIs(t, b.Report([]float32{1}), ErrShape)
	// Not reported: the next resolve takes it as not fired.
	require.NoError(t, b.Resolve(0, batch, 2))
	require.Equal(t, uint64(1), st.Stats().GateReportsMissed)
	require.NoError(t, b.Report([]float32{0.9, 0.9}), "fires")
	require.NoError(t, b.Resolve(0, batch, 2))
	require.Equal(t, uint64(1), st.Stats().GateScopes[ScopeRestOfRequest].Engaged)
	require.Equal(t, uint64(1), st.Stats().GateScopes[ScopeRestOfRequest].Fires)
	require.Equal(t, uint64(1), st.Stats().GateScopes[ScopeRestOfRequest].Evaluations, "the step never reported was not evaluated")
}

// More probe gates per row or distinct gates than the tables hold is ErrBatchCapacity, with
// the slots unchanged.
func TestBatchGatesCapacity(t *testing.T) {
	e := gateTableEngine(t)
	probe := When{Kind: WhenProbe, Probe: GateSource{Name: "p"}, Threshold: 0.5, Sharpness: 100}
	add := func(k float32) GateApply { return GateApply{Kind: ApplyAdd, Steer: GateSource{Name: "s"}, Strength: k} }
	_, err := e.Admit(Admission{RequestID: "two", Gates: []Gate{{When: probe, Scope: ScopeThisToken, Apply: add(1)}, {When: probe, Scope: ScopeNextStep, Apply: add(1)}}})
	require.NoError(t, err)
	_, err = e.Admit(Admission{RequestID: "other", Gates: []Gate{{When: probe, Scope: ScopeThisToken, Apply: add(3)}}})
	require.NoError(t, err)
	st := e.NewStepper()
	defer st.Close()
	b, err := st.NewBatch(BatchOptions{MaxRowGates: 1, MaxGateSlots: 1})
	require.NoError(t, err)
	require.NoError(t, b.Resolve(0, []Span{{ID: "other", Start: 0, End: 1, Phase: PhaseDecode}}, 1))
	require.NoError(t, b.Report([]float32{0}))
	err = b.Resolve(0, []Span{{ID: "two", Start: 0, End: 1, Phase: PhaseDecode}}, 1)
	require.ErrorIs(t, err, ErrBatchCapacity)
	require.Contains(t, err.Error(), "max_row_gates")
	b2, err := st.NewBatch(BatchOptions{MaxGateSlots: 1})
	require.NoError(t, err)
	err = b2.Resolve(0, []Span{{ID: "other", Start: 0, End: 1, Phase: PhaseDecode}, {ID: "two", Start: 1, End: 2, Phase: PhaseDecode}}, 2)
	require.ErrorIs(t, err, ErrBatchCapacity)
	require.Contains(t, err.Error(), "max_gate_slots")
}

// A resolved step whose sites run natively (Stepper.Apply in it) is gated by the Stepper:
// the Batch's step no longer awaits a report, and the decisions are the Stepper's.
func TestBatchGatesNativeApplyInResolvedStep(t *testing.T) {
	e := gateTableEngine(t)
	_, err := e.Admit(Admission{RequestID: "r", Override: gateTableSteering(), Gates: []Gate{{When: When{Kind: WhenProbe, Probe: GateSource{Name: "p"}, Threshold: 0.5, Sharpness: 100},
		Scope: ScopeNextStep, Apply: GateApply{Kind: ApplyAdd, Steer: GateSource{Name: "s"}, Strength: 2}}}})
	require.NoError(t, err)
	native := e.NewStepper()
	defer native.Close()
	st := e.NewStepper()
	defer st.Close()
	b, err := st.NewBatch(BatchOptions{})
	require.NoError(t, err)
	batch := []Span{{ID: "r", Start: 0, End: 1, Phase: PhaseDecode}}
	hook, _ := smallCfg.Hook("post_block")
	for _, h0 := range []float32{0.9, 0.1, 0.1} {
		want := runGateStep(t, native, "r", gateStep{h0: []float32{h0}})
		require.NoError(t, b.Resolve(0, batch, 1))
		require.True(t, b.AwaitsReport())
		for l := range 3 {
			h := make([]float32, smallCfg.Hidden)
			h[0] = h0
			require.NoError(t, st.Apply(hook, l, h, batch))
			require.Equal(t, want[l][0], added{h[1], h[2]}, "layer %d", l)
		}
		require.False(t, b.AwaitsReport())
		st.End()
		require.Equal(t, native.GateChecksum(), st.GateChecksum())
	}
	require.Equal(t, native.Stats().GateScopes, st.Stats().GateScopes)
	require.Zero(t, st.Stats().GateReportsMissed)
}
