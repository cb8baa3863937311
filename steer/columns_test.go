package steer

import (
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/internal/proctest"
	"github.com/shmsteer/shmsteer/shm"
)

// newOwnerColumns is newOwner with a column pool of n columns (negative: none).
func newOwnerColumns(t testing.TB, cfg ModelConfig, n int) *Owner {
	t.Helper()
	rc, err := RegionConfig(cfg, shm.Config{IndexSlots: 1 << 12, ArenaBytes: 32 << 20, ReaderSlots: 64, Columns: n})
	require.NoError(t, err)
	r, err := shm.Create(rc)
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	e, err := Open(r, &cfg, Options{Logf: t.Logf})
	require.NoError(t, err)
	return e
}

// inCell reports whether v is the floats of cell (hook, layer) of one of the view's columns.
func inCell(v []float32, cv *composedView, site int) bool {
	for _, k := range cv.cols[:cv.ncols] {
		if c := cv.pool.CellFloat32(int(k), site); len(c) > 0 && reflect.ValueOf(c).Pointer() == reflect.ValueOf(v).Pointer() {
			return true
		}
	}
	return false
}

// colVec is the vector of request generation n at (hook, layer) and phase: a base-tier
// vector for even n (one column: both phases share a cell), different prefill and decode
// vectors for odd n (two columns).
func colVec(d, n, hook, layer int, p Phase) []float32 {
	x := float32(n*1000 + hook*10 + layer + 1)
	if n%2 == 1 && p == PhaseDecode {
		x = -x
	}
	v := filled(d, x)
	v[n%d] += 0.5 // not constant: a cell written at the wrong offset shows
	return v
}

// colSteering is request generation n's steering: colVec at every (hook, layer).
func colSteering(cfg ModelConfig, n int) *Steering {
	var s Steering
	for hk := range cfg.NumHooks() {
		for l := range cfg.Layers {
			name := cfg.HookName(HookID(hk))
			if n%2 == 0 {
				s.Base.Vectors = append(s.Base.Vectors, Vector{Hook: name, Layer: l, Scale: 1, Data: colVec(cfg.Hidden, n, hk, l, PhasePrefill)})
				continue
			}
			s.Prefill.Vectors = append(s.Prefill.Vectors, Vector{Hook: name, Layer: l, Scale: 1, Data: colVec(cfg.Hidden, n, hk, l, PhasePrefill)})
			s.Decode.Vectors = append(s.Decode.Vectors, Vector{Hook: name, Layer: l, Scale: 1, Data: colVec(cfg.Hidden, n, hk, l, PhaseDecode)})
		}
	}
	return &s
}

// checkColumnsStep steps every request admitted at the Stepper's version (ids "c-N") at every
// site in both phases from zeros and returns an error unless each row is exactly its request's
// colVec.
func checkColumnsStep(st *Stepper, snap *shm.Snapshot, cfg ModelConfig) (int, error) {
	var ids []int
	err := snap.Range(KindRequest, func(key, _ []byte, _ uint64) bool {
		if n, err := strconv.Atoi(strings.TrimPrefix(string(key), "c-")); err == nil {
			ids = append(ids, n)
		}
		return true
	})
	if err != nil {
		return 0, err
	}
	d := cfg.Hidden
	h := make([]float32, len(ids)*d)
	for _, p := range []Phase{PhasePrefill, PhaseDecode} {
		batch := make([]Span, len(ids))
		for i, n := range ids {
			batch[i] = Span{ID: fmt.Sprint("c-", n), Start: i, End: i + 1, Phase: p}
		}
		for hk := range cfg.NumHooks() {
			for l := range cfg.Layers {
				clear(h)
				if err := st.Apply(HookID(hk), l, h, batch); err != nil {
					return 0, err
				}
				for i, n := range ids {
					if want := colVec(d, n, hk, l, p); !sameBits(h[i*d:(i+1)*d], want) {
						return 0, fmt.Errorf("request c-%d at version %d, hook %d layer %d %s: row %v, want %v", n, st.Version(), hk, l, p, h[i*d:i*d+3], want[:3])
					}
				}
			}
		}
	}
	return len(ids), nil
}

// TestColumnsFallbacks: Status.ColumnsFallbacks counts the compositions stored in their entry
// because the pool was full (an admission, and a recomposition when a named vector they
// reference changes), in the owner at once and in a reader as of the owner's last admission;
// a request without its own vectors, a pool with room again, or a region without a pool do
// not count.
func TestColumnsFallbacks(t *testing.T) {
	cfg := smallCfg
	e := newOwnerColumns(t, cfg, 1)
	rd := newReader(t, e, Options{})
	fallbacks := func(e *Engine) uint64 {
		t.Helper()
		st, err := e.Status()
		require.NoError(t, err)
		return st.ColumnsFallbacks
	}
	_, err := e.Register("n", []Vector{{Hook: "mlp_in", Layer: 2, Scale: 1, Data: filled(cfg.Hidden, 9)}})
	require.NoError(t, err)
	admit := func(n int, s *Steering) {
		t.Helper()
		_, err := e.Admit(Admission{RequestID: fmt.Sprint("c-", n), Override: s})
		require.NoError(t, err)
	}
	admit(0, colSteering(cfg, 0)) // the pool's one column
	require.Zero(t, fallbacks(e.Engine))
	withRef := colSteering(cfg, 2)
	withRef.Base.Refs = []Ref{{Name: "n", Strength: 1}}
	admit(1, withRef) // the pool is full: in its entry
	require.EqualValues(t, 1, fallbacks(e.Engine))
	require.EqualValues(t, 1, e.ColumnsFallbacks())
	require.EqualValues(t, 1, fallbacks(rd.Engine), "a reader sees the owner's count")
	admit(2, &Steering{Base: Tier{Refs: []Ref{{Name: "n", Strength: 1}}}}) // no own vectors: no column wanted
	require.EqualValues(t, 1, fallbacks(e.Engine))

	// c-1 is recomposed when n changes: the pool is still full.
	_, err = e.Register("n", []Vector{{Hook: "mlp_in", Layer: 2, Scale: 1, Data: filled(cfg.Hidden, 7)}})
	require.NoError(t, err)
	require.EqualValues(t, 2, fallbacks(e.Engine))

	// c-0 ends: once reclaimed, its column takes the next request.
	_, err = e.End("c-0")
	require.NoError(t, err)
	require.NoError(t, e.Region().Reclaim())
	admit(3, colSteering(cfg, 4)) // equal phases: one column
	require.EqualValues(t, 2, fallbacks(e.Engine))
	require.EqualValues(t, 2, fallbacks(rd.Engine))

	// Without a pool, vectors in their entries are the layout, not a fallback.
	e2 := newOwnerColumns(t, cfg, -1)
	for n := range 2 {
		_, err := e2.Admit(Admission{RequestID: fmt.Sprint("c-", n), Override: colSteering(cfg, n)})
		require.NoError(t, err)
	}
	require.Zero(t, fallbacks(e2.Engine))
}

// TestColumnsPlacement: a request's own vectors are read from the column pool, cell (hook,
// layer) of its column, one column when both phases hold the same floats and two when they
// differ; named vectors are still read in place; a full pool stores vectors in the entry, with
// the same results; ended requests' columns are reused once reclaimed; and a region without a
// pool works as before.
func TestColumnsPlacement(t *testing.T) {
	cfg := smallCfg
	d := cfg.Hidden
	e := newOwnerColumns(t, cfg, 3)
	_, err := e.Register("n", []Vector{{Hook: "mlp_in", Layer: 2, Scale: 1, Data: filled(d, 9)}})
	require.NoError(t, err)
	for n := range 3 { // c-0: one column, c-1: two (the pool is then full), c-2: in its entry
		s := colSteering(cfg, n)
		s.Base.Refs = []Ref{{Name: "n", Strength: 1}}
		_, err := e.Admit(Admission{RequestID: fmt.Sprint("c-", n), Override: s})
		require.NoError(t, err)
	}
	snap, err := e.Region().Snapshot()
	require.NoError(t, err)
	named, _, err := snap.View(KindVector, "n")
	require.NoError(t, err)
	for n, wantCols := range []int{1, 2, 0} {
		cv, err := openComposed(&snap, cfg, e.pool, KindComposed, fmt.Sprint("c-", n), KindRequest)
		require.NoError(t, err)
		require.Equal(t, wantCols, cv.ncols, "c-%d", n)
		for hk := range cfg.NumHooks() {
			for l := range cfg.Layers {
				site := hk*cfg.Layers + l
				pre, _, _ := cv.at(2 * site)
				dec, _, _ := cv.at(2*site + 1)
				if hk == 3 && l == 2 { // mlp_in 2: the named vector is added to the request's own
					require.Equal(t, colVec(d, n, hk, l, PhasePrefill)[1]+9, pre[1])
				} else {
					require.True(t, sameBits(pre, colVec(d, n, hk, l, PhasePrefill)))
					require.True(t, sameBits(dec, colVec(d, n, hk, l, PhaseDecode)))
				}
				require.Equal(t, wantCols > 0, inCell(pre, &cv, site), "c-%d site %d prefill in a column", n, site)
				require.Equal(t, wantCols > 0, inCell(dec, &cv, site), "c-%d site %d decode in a column", n, site)
				require.Equal(t, n%2 == 0, reflect.ValueOf(pre).Pointer() == reflect.ValueOf(dec).Pointer(), "c-%d site %d: one cell for equal phases", n, site)
			}
		}
	}
	st := e.NewStepper()
	defer st.Close()
	require.NoError(t, st.Begin(0))
	got, err := checkColumnsStep(st, &snap, ModelConfig{Hidden: d, Layers: 2}) // layers 0-1: no named term there
	require.NoError(t, err)
	require.Equal(t, 3, got)
	st.End()
	_ = named
	require.NotZero(t, e.ColumnsFallbacks(), "c-2 found the pool full")
	snap.Close()

	// c-0 and c-1 end: once reclaimed, their three columns take new requests.
	for n := range 2 {
		_, err := e.End(fmt.Sprint("c-", n))
		require.NoError(t, err)
	}
	require.NoError(t, e.Region().Reclaim())
	full := e.ColumnsFallbacks()
	for n := 3; n < 5; n++ {
		_, err := e.Admit(Admission{RequestID: fmt.Sprint("c-", n), Override: colSteering(cfg, n)})
		require.NoError(t, err)
	}
	require.Equal(t, full, e.ColumnsFallbacks(), "the ended requests' columns were reused")
	snap, err = e.Region().Snapshot()
	require.NoError(t, err)
	require.NoError(t, st.Begin(0))
	got, err = checkColumnsStep(st, &snap, ModelConfig{Hidden: d, Layers: 2}) // c-2 has the named term at layer 2
	require.NoError(t, err)
	require.Equal(t, 3, got)
	st.End()
	snap.Close()

	// No pool: every vector in its entry, the same steps.
	e2 := newOwnerColumns(t, cfg, -1)
	require.False(t, e2.poolFits)
	for n := range 2 {
		_, err := e2.Admit(Admission{RequestID: fmt.Sprint("c-", n), Override: colSteering(cfg, n)})
		require.NoError(t, err)
	}
	st2 := e2.NewStepper()
	defer st2.Close()
	snap, err = e2.Region().Snapshot()
	require.NoError(t, err)
	defer snap.Close()
	require.NoError(t, st2.Begin(0))
	got, err = checkColumnsStep(st2, &snap, cfg)
	require.NoError(t, err)
	require.Equal(t, 2, got)
	st2.End()
}

// colReaderRun is the "colreader" child: it attaches to the parent's region (fds 3 and 4)
// and, until killed or its time is up, pins a version, checks every admitted request's rows
// (checkColumnsStep), holds the pin a moment while the owner goes on ending requests and
// reusing their columns, and checks the same version again. It prints "ok STEPS" at the end,
// or "bad ERROR" at the first wrong row.
func colReaderRun() {
	fail := func(err error) { fmt.Println("bad", err); os.Exit(0) }
	reg, err := shm.Open(os.NewFile(3, "data"), os.NewFile(4, "readers"))
	if err != nil {
		fail(err)
	}
	e, err := Attach(reg, nil, Options{})
	if err != nil {
		fail(err)
	}
	st := e.NewStepper()
	fmt.Println("ok ready")
	steps := 0
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
		if err := st.Begin(0); err != nil {
			fail(err)
		}
		snap, err := reg.SnapshotAt(st.Version())
		if err != nil {
			fail(err)
		}
		for range 2 {
			if _, err := checkColumnsStep(st, &snap, e.Config()); err != nil {
				fail(err)
			}
			time.Sleep(time.Millisecond)
		}
		snap.Close()
		st.End()
		steps++
	}
	fmt.Println("ok", steps)
}

// TestColumnsReuseKill: worker processes check, at pinned versions, that every request's rows
// are exactly its vectors while the owner admits and ends requests through a pool of 4 columns
// (so columns are reused, and some requests find it full); workers are SIGKILLed at random
// points and replaced. No worker ever sees a column rewritten under its pin, and once they are
// gone every column comes back.
func TestColumnsReuseKill(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	cfg := smallCfg
	e := newOwnerColumns(t, cfg, 4)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	data, readers := e.Region().Files()
	start := func() *proctest.Proc {
		cmd := proctest.Command(os.Args[0], []string{"-test.run=^$"}, []string{roleEnv}, roleEnv+"=colreader")
		cmd.ExtraFiles = []*os.File{data, readers}
		p := proctest.Start(t, cmd)
		require.Equal(t, "ok ready", p.Line())
		return p
	}
	procs := []*proctest.Proc{start(), start()}
	killed, n := 0, 0
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); n++ {
		_, err := e.Admit(Admission{RequestID: fmt.Sprint("c-", n), Override: colSteering(cfg, n)})
		require.NoError(t, err)
		if n >= 3 {
			_, err = e.End(fmt.Sprint("c-", n-3))
			require.NoError(t, err)
		}
		if n%8 == 0 {
			require.NoError(t, e.Region().Reclaim())
		}
		if rng.IntN(40) == 0 {
			i := rng.IntN(len(procs))
			procs[i].Kill()
			killed++
			procs[i] = start()
		}
		time.Sleep(time.Duration(rng.IntN(400)) * time.Microsecond)
	}
	for _, p := range procs {
		line := p.Line()
		require.True(t, strings.HasPrefix(line, "ok "), "worker: %s", line)
		p.Exit()
	}
	t.Logf("%d requests, %d workers killed, %d stored in their entries (pool full)", n, killed, e.ColumnsFallbacks())
	require.NotZero(t, e.ColumnsFallbacks(), "the pool was full at times")
	require.Less(t, e.ColumnsFallbacks(), uint64(n), "most requests got columns")
	for i := max(0, n-3); i < n; i++ {
		_, err := e.End(fmt.Sprint("c-", i))
		require.NoError(t, err)
	}
	require.NoError(t, e.Region().Reclaim())
	require.NoError(t, e.Region().Reclaim())
	require.Zero(t, e.Region().Stats().ColumnsUsed, "every column is free again")
}

// FuzzParseComposed: whatever bytes a composed entry holds, parsing never faults, and a view
// that parses only hands out vectors of hidden floats (in its data, its terms or the column
// pool) and clamp records within the entry.
func FuzzParseComposed(f *testing.F) {
	cfg := fuzzCfg
	e := newOwnerColumns(f, cfg, 2)
	rng := rand.New(rand.NewPCG(3, 3))
	for n := range 3 { // one column, two, and the pool full: stored in the entry
		s := colSteering(cfg, n)
		s.Base.Clamps = []Clamp{{Hook: "mlp_out", Layer: 1, Dir: unitVec(rng, cfg.Hidden), Min: -1, Max: 1, Strength: 1}}
		_, err := e.Admit(Admission{RequestID: fmt.Sprint("c-", n), Override: s})
		require.NoError(f, err)
		b, err := e.Region().Get(KindComposed, fmt.Sprint("c-", n), nil)
		require.NoError(f, err)
		f.Add(b)
	}
	f.Add([]byte(composedMagic))
	sites := cfg.NumHooks() * cfg.Layers * 2
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := parseComposed(b, cfg, 1, e.pool)
		if err != nil {
			require.ErrorIs(t, err, ErrBadEncoding)
			return
		}
		// In-place terms are not resolved here (resolveTerms reads the set's entry): at must
		// then hand out no vector for them rather than fault.
		blk := make([]float32, 2*cfg.Hidden)
		for ix := range sites {
			vec, cl, _ := v.at(ix)
			if vec != nil {
				require.Len(t, vec, cfg.Hidden)
				_ = vec[cfg.Hidden-1]
			}
			require.Zero(t, len(cl)%clampRec)
			v.applyClamps(blk, cfg.Hidden, cl)
		}
	})
}

// TestStepColumnRuns: one-row spans whose vectors are adjacent cells of the pool, on adjacent
// rows, are added as one run (StepStats.ColumnRuns), with exactly the rows a span-by-span add
// makes; a span out of column order, an unsteered request, a clamp, a span of two rows or a
// global vector ends a run or keeps spans out of one, and the rows stay exact.
func TestStepColumnRuns(t *testing.T) {
	cfg := ModelConfig{Hidden: 64, Layers: 2} // 256-byte cells: a run is one block of rows
	d := cfg.Hidden
	e := newOwnerColumns(t, cfg, 16)
	const n = 8
	for i := range n {
		s := colSteering(cfg, 2*i) // even generations: one column each, columns 0-7 in order
		if i == 5 {
			s.Base.Clamps = []Clamp{{Hook: "pre_attn", Layer: 1, Dir: filled(d, 0.125), Min: -1e6, Max: 1e6, Strength: 1}}
		}
		_, err := e.Admit(Admission{RequestID: fmt.Sprint("c-", i), Override: s})
		require.NoError(t, err)
	}
	_, err := e.Admit(Admission{RequestID: "plain"})
	require.NoError(t, err)
	st := e.NewStepper()
	defer st.Close()
	require.True(t, st.runs)
	step := func(batch []Span, rows int, g []float32) {
		t.Helper()
		h := make([]float32, rows*d)
		h0 := randVec(rand.New(rand.NewPCG(9, 9)), rows*d)
		require.NoError(t, st.Begin(0))
		for hk := range cfg.NumHooks() {
			for l := range cfg.Layers {
				copy(h, h0)
				require.NoError(t, st.Apply(HookID(hk), l, h, batch))
				checkColumnRunRows(t, d, hk, l, h0, h, batch, g)
			}
		}
		st.End()
	}
	rows := func(ids ...string) []Span {
		var b []Span
		for i, id := range ids {
			b = append(b, Span{ID: id, Start: i, End: i + 1, Phase: PhaseDecode})
		}
		return b
	}
	inOrder := rows("c-0", "c-1", "c-2", "c-3", "c-4", "c-5", "c-6", "c-7")
	before := st.Stats()
	step(inOrder, n, nil)
	after := st.Stats()
	sites := uint64(cfg.NumHooks() * cfg.Layers)
	// c-5 has a clamp at one site: there the run is c-0..c-4 and c-6..c-7.
	require.Equal(t, sites+1, after.ColumnRuns-before.ColumnRuns)
	require.Equal(t, sites*n-1, after.RunRows-before.RunRows)

	before = after
	step(rows("c-7", "c-6", "c-5", "c-4", "c-3", "c-2", "c-1", "c-0"), n, nil) // columns descending: no run
	after = st.Stats()
	require.Equal(t, before.ColumnRuns, after.ColumnRuns)

	before = after
	gapped := rows("c-0", "c-1", "plain", "c-2", "c-3")
	step(gapped, 5, nil) // the unsteered row breaks the run: c-0..c-1 and c-2..c-3
	after = st.Stats()
	require.Equal(t, 2*sites, after.ColumnRuns-before.ColumnRuns)

	before = after
	wide := []Span{{ID: "c-0", Start: 0, End: 1, Phase: PhaseDecode}, {ID: "c-1", Start: 1, End: 3, Phase: PhaseDecode}, {ID: "c-2", Start: 3, End: 4, Phase: PhaseDecode}}
	step(wide, 4, nil) // a two-row span joins no run
	after = st.Stats()
	require.Equal(t, before.ColumnRuns, after.ColumnRuns)

	var g Steering
	gv := filled(d, 0.25)
	for hk := range cfg.NumHooks() {
		for l := range cfg.Layers {
			g.Decode.Vectors = append(g.Decode.Vectors, Vector{Hook: cfg.HookName(HookID(hk)), Layer: l, Scale: 1, Data: gv})
		}
	}
	_, err = e.SetGlobal(g)
	require.NoError(t, err)
	before = st.Stats()
	step(inOrder, n, gv) // a global vector at every site: each row adds both, no run
	after = st.Stats()
	require.Equal(t, before.ColumnRuns, after.ColumnRuns)
}

// checkColumnRunRows checks one site of TestStepColumnRuns' step: an unsteered span's rows got
// the global vector g only (nil: none), a "c-<i>" span's rows its column vector plus g.
func checkColumnRunRows(t *testing.T, d, hk, l int, h0, h []float32, batch []Span, g []float32) {
	t.Helper()
	for _, sp := range batch {
		var i int
		if _, err := fmt.Sscanf(sp.ID, "c-%d", &i); err != nil {
			for r := sp.Start; r < sp.End; r++ { // unsteered: the global vector only
				for j := range d {
					x := h0[r*d+j]
					if g != nil {
						x += g[j]
					}
					require.Equal(t, x, h[r*d+j])
				}
			}
			continue
		}
		if i == 5 && hk == 0 && l == 1 {
			continue // clamped: its own test's business
		}
		v := colVec(d, 2*i, hk, l, PhaseDecode)
		for r := sp.Start; r < sp.End; r++ {
			for j := range d {
				x := v[j]
				if g != nil {
					x += g[j]
				}
				require.Equal(t, h0[r*d+j]+x, h[r*d+j], "span %s row %d site %d/%d", sp.ID, r, hk, l)
			}
		}
	}
}

// mixedDecodeEngine is an engine whose requests mix what a decode step's walk meets: requests
// in columns (one and two each), two stored in their entries (the pool is full), a clamp at one
// site, a request steered at one site only, an unsteered one, and a global vector at one site.
func mixedDecodeEngine(t testing.TB) (*Owner, ModelConfig) {
	cfg := ModelConfig{Hidden: 64, Layers: 3}
	d := cfg.Hidden
	e := newOwnerColumns(t, cfg, 6)
	admit := func(id string, s *Steering) {
		t.Helper()
		_, err := e.Admit(Admission{RequestID: id, Override: s})
		require.NoError(t, err)
	}
	for i, gen := range []int{0, 1, 2, 4} { // columns 0, 1-2, 3, 4
		s := colSteering(cfg, gen)
		if i == 2 {
			s.Base.Clamps = []Clamp{{Hook: "pre_attn", Layer: 1, Dir: filled(d, 0.125), Min: -1, Max: 1, Strength: 1}}
		}
		admit(fmt.Sprint("c-", i), s)
	}
	// Column 5; then the pool is full: entry-a and entry-b are stored in their entries.
	admit("one-site", &Steering{Decode: Tier{Vectors: []Vector{{Hook: cfg.HookName(1), Layer: 2, Scale: 1, Data: colVec(d, 7, 1, 2, PhaseDecode)}}}})
	admit("entry-a", colSteering(cfg, 6))
	admit("entry-b", colSteering(cfg, 3))
	admit("plain", nil)
	var g Steering
	g.Decode.Vectors = []Vector{{Hook: cfg.HookName(2), Layer: 0, Scale: 1, Data: filled(d, 0.25)}}
	_, err := e.SetGlobal(g)
	require.NoError(t, err)
	return e, cfg
}

// decodeRows is a decode batch of one row per id, in order.
func decodeRows(ids ...string) []Span {
	var b []Span
	for i, id := range ids {
		b = append(b, Span{ID: id, Start: i, End: i + 1, Phase: PhaseDecode})
	}
	return b
}

// TestStepApplyRunsMatchesGeneral steps a decode batch through a program with runs of adjacent
// cells (a Stepper as made) and without (a Stepper whose runs are off) and requires the same
// rows, bit for bit, at every site, and the same checksum. The batch mixes what runs join and
// what they do not: requests in columns
// (one and two each), two stored in their entries because the pool was full, a clamp at one
// site, a request steered at one site only (act 0 elsewhere), an unsteered request, rows out
// of order, and sites with a global vector (pairs, never runs).
func TestStepApplyRunsMatchesGeneral(t *testing.T) {
	e, cfg := mixedDecodeEngine(t)
	d := cfg.Hidden
	fast, general := e.NewStepper(), e.NewStepper()
	defer fast.Close()
	defer general.Close()
	require.True(t, fast.runs)
	general.runs = false
	ids := [][]string{
		{"c-0", "c-1", "c-2", "c-3", "one-site"},
		{"c-0", "c-1", "entry-a", "c-2", "c-3", "plain", "one-site", "entry-b"},
		{"entry-a", "c-0", "c-1", "c-3", "c-2", "one-site"},
		{"one-site", "c-3", "c-2", "c-1", "c-0", "entry-b", "plain"},
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, order := range ids {
		var batch []Span
		for i, id := range order {
			batch = append(batch, Span{ID: id, Start: i, End: i + 1, Phase: PhaseDecode})
		}
		h0 := randVec(rng, len(batch)*d)
		hf, hg := make([]float32, len(h0)), make([]float32, len(h0))
		require.NoError(t, fast.Begin(0))
		require.NoError(t, general.Begin(0))
		before := fast.Stats()
		for hk := range cfg.NumHooks() {
			for l := range cfg.Layers {
				copy(hf, h0)
				copy(hg, h0)
				require.NoError(t, fast.Apply(HookID(hk), l, hf, batch))
				require.NoError(t, general.Apply(HookID(hk), l, hg, batch))
				require.Equal(t, hg, hf, "batch %v, site %d/%d", order, hk, l)
				require.NotEqual(t, h0, hf, "batch %v, site %d/%d: something is steered at every site", order, hk, l)
			}
		}
		require.True(t, oraclePlanRuns(fast), "batch %v: one ungated row per span", order)
		require.Equal(t, general.End(), fast.End(), "checksum of batch %v", order)
		if order[0] == "c-0" {
			require.Greater(t, fast.Stats().ColumnRuns, before.ColumnRuns, "batch %v: c-0 and c-1 make a run", order)
		}
	}
	require.Zero(t, general.Stats().ColumnRuns)
	for id, cols := range map[string]int{"c-0": 1, "c-1": 2, "one-site": 1, "entry-a": 0, "entry-b": 0} {
		require.Equal(t, cols, fast.reqs[id].view.ncols, "%s's columns", id)
	}
}
