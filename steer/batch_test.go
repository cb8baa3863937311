package steer

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// devTables is what a device worker keeps: per site a table [slots+1][hidden] and clamp rows,
// written only from a Batch's updates. apply is the gather-add and the clamps in float32, as
// the Python device path computes them.
type devTables struct {
	d, maxClamps int
	vec          map[int32][][]float32
	dirs         map[int32][][]float32 // [slot][k*d ...]
	params       map[int32][][]float32 // [slot][k*3 ...]
	uploads      int
}

func newDevTables(d, maxClamps int) *devTables {
	return &devTables{d: d, maxClamps: maxClamps, vec: map[int32][][]float32{}, dirs: map[int32][][]float32{}, params: map[int32][][]float32{}}
}

func (t *devTables) table(site int32, slots int) {
	if t.vec[site] == nil {
		t.vec[site] = make([][]float32, slots+1)
		t.dirs[site] = make([][]float32, slots+1)
		t.params[site] = make([][]float32, slots+1)
		for i := range t.vec[site] {
			t.vec[site][i] = make([]float32, t.d)
			t.dirs[site][i] = make([]float32, t.maxClamps*t.d)
			t.params[site][i] = make([]float32, t.maxClamps*3)
		}
	}
}

func (t *devTables) update(b *Batch) {
	d := t.d
	for i, u := range b.Updates {
		t.table(u.Site, b.opt.MaxSlots)
		copy(t.vec[u.Site][u.Slot], b.Stage[i*d:(i+1)*d])
		dirs, params := t.dirs[u.Site][u.Slot], t.params[u.Site][u.Slot]
		clear(dirs)
		clear(params)
		copy(dirs, b.ClampDirs[int(u.ClampStart)*d:int(u.ClampStart+u.Clamps)*d])
		copy(params, b.ClampParams[int(u.ClampStart)*3:int(u.ClampStart+u.Clamps)*3])
		t.uploads++
	}
}

func (t *devTables) apply(b *Batch, site int32, h []float32) {
	k := indexOfSite(b.Sites, site)
	if k < 0 {
		return // unsteered site: nothing to do
	}
	d := t.d
	for r, slot := range b.Index {
		if slot == 0 {
			continue
		}
		row := h[r*d : (r+1)*d]
		for i, f := range t.vec[site][slot] {
			row[i] += f
		}
		for c := 0; c < int(b.SiteClamps[k]); c++ {
			u := t.dirs[site][slot][c*d : (c+1)*d]
			pr := t.params[site][slot][c*3:]
			var p float32
			for i := range row {
				p += row[i] * u[i]
			}
			q := (min(max(p, pr[0]), pr[1]) - p) * pr[2]
			for i := range row {
				row[i] += q * u[i]
			}
		}
	}
}

func indexOfSite(sites []int32, s int32) int {
	for i, x := range sites {
		if x == s {
			return i
		}
	}
	return -1
}

// checkBatchStep resolves batch and compares, at every site, the device tables' apply with
// Stepper.Apply on the same random input.
func checkBatchStep(t *testing.T, e *Owner, st *Stepper, b *Batch, dev *devTables, rng *rand.Rand, batch []Span, rows int, what string) {
	t.Helper()
	cfg := e.Config()
	d := cfg.Hidden
	require.NoError(t, b.Resolve(0, batch, rows), what)
	dev.update(b)
	require.Len(t, b.Index, rows)
	for hi := range cfg.NumHooks() {
		for l := range cfg.Layers {
			site := int32(hi*cfg.Layers + l)
			h := randVec(rng, rows*d)
			want := append([]float32(nil), h...)
			require.NoError(t, st.Apply(HookID(hi), l, want, batch))
			dev.apply(b, site, h)
			if indexOfSite(b.Sites, site) < 0 {
				// Apply may only leave such a site unchanged.
				for i := range h {
					require.Equal(t, h[i], want[i], "%s: site %d is not in Sites but Apply changed it", what, site)
				}
				continue
			}
			for i := range h {
				diff := float64(h[i] - want[i])
				require.InDelta(t, 0, diff, 1e-4*(1+float64(abs32(want[i]))), "%s: site %d element %d", what, site, i)
			}
		}
	}
	st.End()
}

func abs32(f float32) float32 {
	if f < 0 {
		return -f
	}
	return f
}

func TestBatchMatchesApply(t *testing.T) {
	e := newOwner(t, smallCfg, Options{})
	_, ids, err := scenario(e, 3)
	require.NoError(t, err)
	ids = append(ids, "never-admitted")
	rng := rand.New(rand.NewPCG(5, 6))
	st := e.NewStepper()
	defer st.Close()
	// Few slots: later steps evict and reuse them.
	b, err := st.NewBatch(BatchOptions{MaxSlots: 12, MaxClamps: 4})
	require.NoError(t, err)
	dev := newDevTables(smallCfg.Hidden, 4)
	const rows = 24
	for step := range 12 {
		sub := append([]string(nil), ids...)
		rng.Shuffle(len(sub), func(i, j int) { sub[i], sub[j] = sub[j], sub[i] })
		batch := batchFor(rng, sub[:4+rng.IntN(4)], rows)
		switch step {
		case 4: // re-register a named vector: every composition referencing it changes
			_, err := e.Register("vec-1", []Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: randVec(rng, smallCfg.Hidden)}})
			require.NoError(t, err)
		case 6: // a global change rewrites every slot's rows where the global steers
			_, err := e.SetGlobal(Steering{Base: Tier{Vectors: []Vector{{Hook: "mlp_in", Layer: 2, Scale: 2, Data: randVec(rng, smallCfg.Hidden)}}}})
			require.NoError(t, err)
		case 8: // ended requests fall back to the global slot
			for _, id := range ids[:5] {
				_, err := e.End(id)
				require.NoError(t, err)
			}
		}
		checkBatchStep(t, e, st, b, dev, rng, batch, rows, fmt.Sprint("step ", step))
		// The same batch again uploads nothing.
		require.NoError(t, b.Resolve(0, batch, rows))
		require.Empty(t, b.Updates, "step %d: a steady batch uploads no row", step)
		st.End()
	}
	require.NotZero(t, b.Stats().Evictions, "12 slots for 11 requests in two phases must evict")
	require.NotZero(t, dev.uploads)
}

func TestBatchSteadyStateAllocatesNothing(t *testing.T) {
	e := newOwner(t, smallCfg, Options{})
	_, ids, err := scenario(e, 4)
	require.NoError(t, err)
	st := e.NewStepper()
	defer st.Close()
	b, err := st.NewBatch(BatchOptions{})
	require.NoError(t, err)
	batch := batchFor(rand.New(rand.NewPCG(1, 1)), ids, 32)
	require.NoError(t, b.Resolve(0, batch, 32))
	st.End()
	allocs := testing.AllocsPerRun(50, func() {
		if err := b.Resolve(0, batch, 32); err != nil {
			t.Fatal(err)
		}
		st.End()
	})
	require.Zero(t, allocs)
}

// A serving loop's changed batches (requests leaving, joining, their rows moving) and a slot
// budget too small for them, so that each step evicts and re-stages rows: once the first round
// has grown the batch's buffers, no step allocates.
func TestBatchChangingLayoutsAllocateNothing(t *testing.T) {
	e := newOwner(t, smallCfg, Options{})
	_, ids, err := scenario(e, 4)
	require.NoError(t, err)
	st := e.NewStepper()
	defer st.Close()
	b, err := st.NewBatch(BatchOptions{MaxSlots: 5, MaxClamps: 4})
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(3, 4))
	var layouts [][]Span
	for i := range 6 { // rotating subsets of the requests, in another order each
		sub := append([]string(nil), ids[i%3:i%3+4]...)
		rng.Shuffle(len(sub), func(a, c int) { sub[a], sub[c] = sub[c], sub[a] })
		layouts = append(layouts, batchFor(rng, sub, 24))
	}
	round := func() {
		for _, batch := range layouts {
			if err := b.Resolve(0, batch, 24); err != nil {
				t.Fatal(err)
			}
			st.End()
		}
	}
	round()
	evictions, updates := b.Stats().Evictions, 0
	allocs := testing.AllocsPerRun(20, func() {
		round()
		updates += len(b.Updates)
	})
	require.Zero(t, allocs)
	require.Greater(t, b.Stats().Evictions, evictions, "each round must evict slots and stage rows again")
	require.NotZero(t, updates)
}

func TestBatchChecksumDeterministic(t *testing.T) {
	e := newOwner(t, smallCfg, Options{})
	_, ids, err := scenario(e, 5)
	require.NoError(t, err)
	batch := batchFor(rand.New(rand.NewPCG(2, 2)), ids, 32)
	sum := func(eng *Engine, warm bool) uint64 {
		st := eng.NewStepper()
		defer st.Close()
		b, err := st.NewBatch(BatchOptions{})
		require.NoError(t, err)
		if warm { // a different history (other slots assigned first) gives the same checksum
			require.NoError(t, b.Resolve(0, []Span{{ID: ids[3], Start: 0, End: 1, Phase: PhasePrefill}}, 1))
		}
		require.NoError(t, b.Resolve(0, batch, 32))
		defer st.End()
		return b.Checksum
	}
	a := sum(e.Engine, false)
	require.NotZero(t, a)
	require.Equal(t, a, sum(e.Engine, true))
	require.Equal(t, a, sum(newReader(t, e, Options{}).Engine, false))
}

func TestBatchBadInputChangesNothing(t *testing.T) {
	e := newOwner(t, smallCfg, Options{})
	_, ids, err := scenario(e, 6)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(7, 8))
	st := e.NewStepper()
	defer st.Close()
	b, err := st.NewBatch(BatchOptions{MaxSlots: 3, MaxClamps: 4})
	require.NoError(t, err)
	dev := newDevTables(smallCfg.Hidden, 4)
	good := []Span{{ID: ids[0], Start: 0, End: 2, Phase: PhaseDecode}, {ID: ids[1], Start: 2, End: 3, Phase: PhasePrefill}}
	checkBatchStep(t, e, st, b, dev, rng, good, 4, "before")
	before := b.Stats()

	var many []Span
	for i := range 5 {
		many = append(many, Span{ID: ids[i], Start: i, End: i + 1, Phase: PhaseDecode})
	}
	require.ErrorIs(t, b.Resolve(0, many, 5), ErrBatchCapacity)
	require.ErrorIs(t, b.Resolve(0, []Span{{ID: ids[0], Start: 0, End: 9, Phase: PhaseDecode}}, 4), ErrBadBatch)
	require.ErrorIs(t, b.Resolve(0, []Span{{ID: ids[0], Start: 0, End: 1, Phase: 7}}, 4), ErrBadBatch)
	require.Equal(t, before, b.Stats())
	require.ErrorIs(t, st.Apply(0, 0, make([]float32, smallCfg.Hidden), nil), ErrNoStep, "a failed Resolve ends the step")

	// The tables still match the slots: the good batch needs no upload and applies the same.
	require.NoError(t, b.Resolve(0, good, 4))
	require.Empty(t, b.Updates)
	st.End()
	checkBatchStep(t, e, st, b, dev, rng, good, 4, "after")

	_, err = st.NewBatch(BatchOptions{MaxSlots: -1})
	require.ErrorIs(t, err, ErrBadConfig)
}

func TestBatchTooManyClamps(t *testing.T) {
	e := newOwner(t, smallCfg, Options{})
	rng := rand.New(rand.NewPCG(9, 9))
	d := smallCfg.Hidden
	var cl []Clamp
	for range 3 {
		cl = append(cl, Clamp{Hook: "post_block", Layer: 0, Dir: unitVec(rng, d), Min: -1, Max: 1, Strength: 1})
	}
	_, err := e.Admit(Admission{RequestID: "c", Override: &Steering{Base: Tier{Clamps: cl}}})
	require.NoError(t, err)
	st := e.NewStepper()
	defer st.Close()
	b, err := st.NewBatch(BatchOptions{MaxClamps: 2})
	require.NoError(t, err)
	err = b.Resolve(0, []Span{{ID: "c", Start: 0, End: 1, Phase: PhaseDecode}}, 1)
	require.ErrorIs(t, err, ErrBatchCapacity)
	require.Contains(t, err.Error(), "post_block")
	none, err := st.NewBatch(BatchOptions{MaxClamps: -1})
	require.NoError(t, err)
	require.Zero(t, none.Options().MaxClamps)
	require.ErrorIs(t, none.Resolve(0, []Span{{ID: "c", Start: 0, End: 1, Phase: PhaseDecode}}, 1), ErrBatchCapacity)
	b3, err := st.NewBatch(BatchOptions{MaxClamps: 3})
	require.NoError(t, err)
	require.NoError(t, b3.Resolve(0, []Span{{ID: "c", Start: 0, End: 1, Phase: PhaseDecode}}, 1))
	require.Equal(t, []int32{3}, b3.SiteClamps)
	st.End()
}

func TestBatchSites(t *testing.T) {
	e := newOwner(t, smallCfg, Options{})
	_, ids, err := scenario(e, 8)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(3, 4))
	st := e.NewStepper()
	defer st.Close()
	b, err := st.NewBatch(BatchOptions{})
	require.NoError(t, err)
	require.ErrorIs(t, b.SetSites([]int32{-1}), ErrLayerRange)
	require.ErrorIs(t, b.SetSites([]int32{int32(smallCfg.NumHooks() * smallCfg.Layers)}), ErrLayerRange)
	hooked := []int32{1, 4, 9, 14}
	require.NoError(t, b.SetSites(hooked))
	dev := newDevTables(smallCfg.Hidden, 4)
	batch := batchFor(rng, ids, 24)
	require.NoError(t, b.Resolve(0, batch, 24))
	dev.update(b)
	for _, u := range b.Updates {
		require.Contains(t, hooked, u.Site)
	}
	for _, s := range b.Sites {
		require.Contains(t, hooked, s)
	}
	st.End()
	// Adding sites: their rows arrive at the next Resolve, and every hooked site applies as
	// Apply does.
	require.NoError(t, b.SetSites(nil))
	checkBatchStep(t, e, st, b, dev, rng, batch, 24, "all sites")
}

func TestBatchSharesSlotsBySteering(t *testing.T) {
	e := newOwner(t, smallCfg, Options{})
	rng := rand.New(rand.NewPCG(11, 12))
	d := smallCfg.Hidden
	_, err := e.Register("n", []Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: randVec(rng, d)}})
	require.NoError(t, err)
	same := &Steering{Base: Tier{Refs: []Ref{{Name: "n", Strength: 1}}}}
	for _, id := range []string{"x", "y", "z"} {
		_, err := e.Admit(Admission{RequestID: id, Override: same})
		require.NoError(t, err)
	}
	_, err = e.Admit(Admission{RequestID: "other", Override: &Steering{Base: Tier{Refs: []Ref{{Name: "n", Strength: 2}}}}})
	require.NoError(t, err)
	st := e.NewStepper()
	defer st.Close()
	b, err := st.NewBatch(BatchOptions{})
	require.NoError(t, err)
	dev := newDevTables(d, 4)
	batch := []Span{{ID: "x", Start: 0, End: 1, Phase: PhaseDecode}, {ID: "y", Start: 1, End: 2, Phase: PhaseDecode},
		{ID: "z", Start: 2, End: 3, Phase: PhaseDecode}, {ID: "other", Start: 3, End: 4, Phase: PhaseDecode}}
	checkBatchStep(t, e, st, b, dev, rng, batch, 4, "shared")
	require.Equal(t, b.Index[0], b.Index[1])
	require.Equal(t, b.Index[0], b.Index[2])
	require.NotEqual(t, b.Index[0], b.Index[3])
	require.Equal(t, 2, dev.uploads, "one row per distinct steering at the one steered site")
	// The request the shared slot was synced from ends: the others keep the slot, no upload.
	_, err = e.End("x")
	require.NoError(t, err)
	checkBatchStep(t, e, st, b, dev, rng, batch[1:], 4, "after end")
	require.Equal(t, 2, dev.uploads)
	// A re-registration changes the shared row once.
	_, err = e.Register("n", []Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: randVec(rng, d)}})
	require.NoError(t, err)
	checkBatchStep(t, e, st, b, dev, rng, batch[1:], 4, "after register")
	require.Equal(t, 4, dev.uploads)
}

// BenchmarkBatchResolve is a device worker's per-step engine work in the shape: 64
// decode rows of 64 requests over 16 named vectors plus a global tier, 32 layers × post_block
// hooked (hidden 4096), in steady state (nothing changed, nothing uploaded).
func BenchmarkBatchResolve(b *testing.B) {
	cfg := ModelConfig{Hidden: 4096, Layers: 32}
	e := newOwner(b, cfg, Options{})
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 16 {
		var vecs []Vector
		for l := range cfg.Layers {
			vecs = append(vecs, Vector{Hook: "post_block", Layer: l, Scale: 1, Data: randVec(rng, cfg.Hidden)})
		}
		_, err := e.Register(fmt.Sprint("v", i), vecs)
		require.NoError(b, err)
	}
	var g []Vector
	for l := range cfg.Layers {
		g = append(g, Vector{Hook: "post_block", Layer: l, Scale: 1, Data: randVec(rng, cfg.Hidden)})
	}
	_, err := e.SetGlobal(Steering{Base: Tier{Vectors: g}})
	require.NoError(b, err)
	var batch []Span
	for r := range 64 {
		id := fmt.Sprint("req-", r)
		_, err := e.Admit(Admission{RequestID: id, Override: &Steering{Decode: Tier{Refs: []Ref{{Name: fmt.Sprint("v", r%16), Strength: 1}}}}})
		require.NoError(b, err)
		batch = append(batch, Span{ID: id, Start: r, End: r + 1, Phase: PhaseDecode})
	}
	st := e.NewStepper()
	defer st.Close()
	bt, err := st.NewBatch(BatchOptions{})
	require.NoError(b, err)
	hook := HookID(indexOfHook(cfg, "post_block"))
	var sites []int32
	for l := range cfg.Layers {
		sites = append(sites, int32(int(hook)*cfg.Layers+l))
	}
	require.NoError(b, bt.SetSites(sites))
	require.NoError(b, bt.Resolve(0, batch, 64))
	require.Len(b, bt.Updates, 16*32)
	st.End()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := bt.Resolve(0, batch, 64); err != nil {
			b.Fatal(err)
		}
		st.End()
	}
	b.StopTimer()
	require.Empty(b, bt.Updates)
	require.Len(b, bt.Sites, 32)
}

func indexOfHook(cfg ModelConfig, name string) int {
	for i, h := range cfg.hooks() {
		if h == name {
			return i
		}
	}
	return -1
}
