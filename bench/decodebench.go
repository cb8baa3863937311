package bench

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/shmsteer/shmsteer/kernels"
	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
)

// The decode step figures (steer.step.decode.*): a whole decode step of 64 requests × 1 row at
// every site of 32 layers × 5 hooks, D = 4096, each steered request with its own vector at
// every site (2.5 MiB per request, 160 MiB for 64): Begin, Bind, 160 ApplyBounds, End (the
// _apply_ns diagnostics: Begin, 160 Applies with the batch, End), against the bare add of the
// same vectors, read in place, to the same rows at the same 160 sites (decodeKernel).
// The sparse pair steers 4 of the 64 requests (the other 60 are admitted without steering) and
// its kernel adds only their 4 rows. Only the public steer API is used: Open, Admit, NewStepper,
// Begin, Bind, ApplyBound, Apply, Effective, End.
const (
	decodeRequests = 64
	decodeLayers   = 32
	decodeSparse   = 4 // steered requests of the sparse figures
)

var decodeModel = steer.ModelConfig{Hidden: stepD, Layers: decodeLayers}

// decodeFixture is one engine with the decode batch admitted, and the same vectors laid out
// for the kernel: table[site] is 1+decodeRequests rows (row 0 the kernel's "no steering" row),
// idx the row of each batch row (0 for an unsteered request).
type decodeFixture struct {
	region *shm.Region
	engine *steer.Owner
	batch  []steer.Span
	h      []float32
	table  [][]float32
	idx    []int32
	sites  int
}

// steered reports whether request i of the batch is steered: all of them, or every
// decodeRequests/decodeSparse-th one when sparse.
func steered(i int, sparse bool) bool {
	return !sparse || i%(decodeRequests/decodeSparse) == 0
}

// newDecodeFixture builds the vectors (the same for every call: a fixed seed), the kernel's
// tables and, withEngine, a region and engine with the batch's requests admitted.
func newDecodeFixture(sparse, withEngine bool) (_ *decodeFixture, err error) {
	cfg := decodeModel
	hooks := cfg.NumHooks()
	f := &decodeFixture{sites: hooks * decodeLayers}
	if withEngine {
		n := decodeRequests
		if sparse {
			n = decodeSparse
		}
		// A request with inline vectors is stored twice: its admitted set, in the arena, and
		// the owner's composition of it, which every rank reads in place: in the region's
		// column pool (steer.RegionConfig's default, one column a request here), or in the
		// arena when the pool is full, for which the arena keeps room.
		perRequest := 2 * int64(hooks*decodeLayers) * (stepD*4 + 256)
		rc, err := steer.RegionConfig(cfg, shm.Config{IndexSlots: 1 << 12, ArenaBytes: (int64(n)*perRequest*5/4 + 32<<20) &^ 63})
		if err != nil {
			return nil, err
		}
		if f.region, err = shm.Create(rc); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				f.region.Close()
			}
		}()
		if f.engine, err = steer.Open(f.region, &cfg, steer.Options{}); err != nil {
			return nil, err
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	f.table = make([][]float32, f.sites)
	for s := range f.table {
		f.table[s] = make([]float32, (decodeRequests+1)*stepD)
	}
	f.idx = make([]int32, decodeRequests)
	for i := range decodeRequests {
		id := fmt.Sprintf("decode-%02d", i)
		a := steer.Admission{RequestID: id}
		if steered(i, sparse) {
			var s steer.Steering
			for hk := range hooks {
				for l := range decodeLayers {
					v := randVec(rng, stepD)
					site := hk*decodeLayers + l
					copy(f.table[site][(i+1)*stepD:], v)
					s.Base.Vectors = append(s.Base.Vectors, steer.Vector{Hook: cfg.HookName(steer.HookID(hk)), Layer: l, Scale: 1, Data: v})
				}
			}
			a.Override = &s
			f.idx[i] = int32(i + 1)
		}
		if withEngine {
			if _, err := f.engine.Admit(a); err != nil {
				return nil, err
			}
		}
		f.batch = append(f.batch, steer.Span{ID: id, Start: i, End: i + 1, Phase: steer.PhaseDecode})
	}
	f.h = decodeH.get(func() []float32 { return randVec(rng, decodeRequests*stepD) })
	return f, nil
}

// step runs one whole decode step through st: Begin, Apply with the batch at every (hook,
// layer), End.
func (f *decodeFixture) step(st *steer.Stepper) error {
	if err := st.Begin(0); err != nil {
		return err
	}
	defer st.End()
	hooks := f.sites / decodeLayers
	for hk := range hooks {
		for l := range decodeLayers {
			if err := st.Apply(steer.HookID(hk), l, f.h, f.batch); err != nil {
				return err
			}
		}
	}
	return nil
}

// boundStep is step with the batch bound once: Begin, Bind, ApplyBound at every (hook,
// layer), End.
func (f *decodeFixture) boundStep(st *steer.Stepper) error {
	if err := st.Begin(0); err != nil {
		return err
	}
	defer st.End()
	if err := st.Bind(f.batch, decodeRequests); err != nil {
		return err
	}
	hooks := f.sites / decodeLayers
	for hk := range hooks {
		for l := range decodeLayers {
			if err := st.ApplyBound(steer.HookID(hk), l, f.h); err != nil {
				return err
			}
		}
	}
	return nil
}

// kernelStep is the bare gather-add of the same vectors at every site.
func (f *decodeFixture) kernelStep(h []float32) {
	for _, t := range f.table {
		kernels.GatherAdd(h, stepD, t, f.idx)
	}
}

// decodeMixed is steer.step.decode.mixed_ns (sparse: steer.step.decode.sparse_ns): a whole
// step through the Stepper, after one warm-up step (the figure is the steady state). bound:
// the batch bound once (Bind, ApplyBound: the goal figures, what a worker applying one batch at
// every site does); otherwise passed to Apply at every site, which compares it each time (the
// _apply_ns diagnostics).
func decodeMixed(sparse, bound bool) setupFunc {
	return func() (Op, func() error, error) {
		f, release, err := decodeEngines[sparseIndex(sparse)].acquire(sparse)
		if err != nil {
			return nil, nil, err
		}
		st := f.engine.NewStepper()
		cleanup := func() error { st.Close(); return release() }
		step := f.step
		if bound {
			step = f.boundStep
		}
		if err := step(st); err != nil {
			return nil, nil, errors.Join(err, cleanup())
		}
		return cpuOp(func(n int) error {
			for range n {
				if err := step(st); err != nil {
					return err
				}
			}
			return nil
		}), cleanup, nil
	}
}

// decodeKernel is steer.step.decode.kernel_ns (sparse: steer.step.decode.sparse_kernel_ns):
// the bare gather-add at each of the 160 sites, as kernels.GatherAdd runs it (each row of the
// batch in turn, one kernels.AddRows for a row with a vector, nothing for a row without), over
// the same rows of the same h (decodeH) and the very vectors the step adds: those of the step's
// own engine (decodeEngines), read in place through a Stepper held in one step
// (Stepper.Effective), so the kernel reads the pages the step reads. With a copy of its own (a
// table per site in the heap, as before), it measured where its 160 MiB happened to lie as
// much as the step's cost: two such copies of the same tables in one process, timed in paired
// rounds, take up to a third longer one than the other, by process (BenchmarkHeapPlacement).
func decodeKernel(sparse bool) setupFunc {
	return func() (Op, func() error, error) {
		f, release, err := decodeEngines[sparseIndex(sparse)].acquire(sparse)
		if err != nil {
			return nil, nil, err
		}
		k, err := f.inPlace()
		if err != nil {
			return nil, nil, errors.Join(err, release())
		}
		cleanup := func() error { k.close(); return release() }
		k.step(f.h)
		return cpuOp(func(n int) error {
			for range n {
				k.step(f.h)
			}
			return nil
		}), cleanup, nil
	}
}

// inPlaceKernel is the decode kernel over an engine's compositions, read in place: sites[s][t]
// is the vector batch row t gets at site s (nil for none). The views alias the region and stay
// valid while st is in its step.
type inPlaceKernel struct {
	st    *steer.Stepper
	sites [][][]float32
}

// inPlace reads, through a Stepper of its own held in one step, the vector each batch row
// gets at each site: the request's composition only (the fixture sets no global steering and
// no clamps, which it checks).
func (f *decodeFixture) inPlace() (_ *inPlaceKernel, err error) {
	if f.engine == nil {
		return nil, errors.New("bench: the in-place decode kernel needs the fixture's engine")
	}
	k := &inPlaceKernel{st: f.engine.NewStepper(), sites: make([][][]float32, f.sites)}
	defer func() {
		if err != nil {
			k.close()
		}
	}()
	if err := k.st.Begin(0); err != nil {
		return nil, err
	}
	for s := range f.sites {
		hook, layer := steer.HookID(s/decodeLayers), s%decodeLayers
		k.sites[s] = make([][]float32, len(f.batch))
		for t, sp := range f.batch {
			eff, err := k.st.Effective(sp.ID, hook, layer, sp.Phase)
			if err != nil {
				return nil, err
			}
			if eff.Global != nil || eff.Clamps != 0 {
				return nil, fmt.Errorf("bench: decode request %s at site %d: global steering or clamps, which the kernel does not add", sp.ID, s)
			}
			k.sites[s][t] = eff.Request
		}
	}
	return k, nil
}

// step gather-adds every site's vectors to their rows of h.
func (k *inPlaceKernel) step(h []float32) {
	for _, vecs := range k.sites {
		for t, v := range vecs {
			if v != nil {
				kernels.AddRows(h[t*stepD:(t+1)*stepD], stepD, 1, v)
			}
		}
	}
}

func (k *inPlaceKernel) close() {
	k.st.End()
	k.st.Close()
}

// sharedDecode is one decode fixture with its engine, made on first use and shared by the step
// figure and its kernel (so both read the same vectors in the same pages), its region closed
// when the last of them is done with it.
type sharedDecode struct {
	mu    sync.Mutex
	f     *decodeFixture
	users int
}

// decodeEngines are the dense ([0]) and the sparse ([1]) pairs' fixtures.
var decodeEngines [2]sharedDecode

func sparseIndex(sparse bool) int {
	if sparse {
		return 1
	}
	return 0
}

// acquire returns the shared fixture, made the first time, and the release of this use.
func (s *sharedDecode) acquire(sparse bool) (*decodeFixture, func() error, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		f, err := newDecodeFixture(sparse, true)
		if err != nil {
			return nil, nil, err
		}
		s.f = f
	}
	s.users++
	var once sync.Once
	return s.f, func() (err error) {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.users--; s.users == 0 {
				err = s.f.region.Close()
				s.f = nil
			}
		})
		return err
	}, nil
}

// scatteredFixture holds the decode step's vectors request-major, as the engine laid them out
// before the column pool (and still does for a request that finds the pool full): each
// request's 160 vectors, in site order, one entry of a region (a memfd mapped with base pages,
// as the engine's region is), so a site's 64 rows lie one request's 2.5 MiB apart. rows[site]
// are the batch rows' vectors there, read in place through a pinned snapshot.
type scatteredFixture struct {
	region *shm.Region
	snap   shm.Snapshot
	h      []float32
	rows   [][][]float32
}

// scatteredKind is the scattered figure's region kind (the region holds nothing else).
const scatteredKind shm.Kind = 1

func newScatteredFixture() (_ *scatteredFixture, err error) {
	k, err := newDecodeFixture(false, false)
	if err != nil {
		return nil, err
	}
	perRequest := int64(k.sites) * (stepD*4 + 256)
	r, err := shm.Create(shm.Config{IndexSlots: 1 << 8, ArenaBytes: (decodeRequests*perRequest*5/4 + 8<<20) &^ 63})
	if err != nil {
		return nil, err
	}
	f := &scatteredFixture{region: r, h: k.h, rows: make([][][]float32, k.sites)}
	defer func() {
		if err != nil {
			f.close()
		}
	}()
	vecs := make([]float32, k.sites*stepD)
	for i := range decodeRequests {
		for s := range k.sites {
			copy(vecs[s*stepD:(s+1)*stepD], k.table[s][(i+1)*stepD:])
		}
		if _, err := r.Update(func(tx *shm.Tx) error {
			return tx.PutFloat32(scatteredKind, fmt.Sprintf("decode-%02d", i), vecs)
		}); err != nil {
			return nil, err
		}
	}
	if f.snap, err = r.Snapshot(); err != nil {
		return nil, err
	}
	for i := range decodeRequests {
		v, _, err := f.snap.ViewFloat32(scatteredKind, fmt.Sprintf("decode-%02d", i))
		if err != nil {
			return nil, err
		}
		if len(v) != len(vecs) {
			return nil, fmt.Errorf("bench: scattered vectors of request %d: %d floats, want %d", i, len(v), len(vecs))
		}
		for s := range k.sites {
			f.rows[s] = append(f.rows[s], v[s*stepD:(s+1)*stepD:(s+1)*stepD])
		}
	}
	return f, nil
}

// step adds every site's rows to h as the Stepper's Apply does (one row per request, the next
// row's pages prefetched), with nothing else of a step.
func (f *scatteredFixture) step(h []float32) {
	for _, rows := range f.rows {
		for i, v := range rows {
			if i+1 < len(rows) {
				kernels.PrefetchPages(rows[i+1])
			}
			kernels.AddRows(h[i*stepD:(i+1)*stepD], stepD, 1, v)
		}
	}
}

func (f *scatteredFixture) close() error {
	f.snap.Close()
	return f.region.Close()
}

// decodeKernelScattered is steer.step.decode.scattered_kernel_ns, a diagnostic beside
// steer.step.decode.kernel_ns (its baseline) and no goal: the bare row adds of the same
// vectors request-major in a memfd (see scatteredFixture). Over kernel_ns it is what that
// layout costs, which the column pool saves.
func decodeKernelScattered() (Op, func() error, error) {
	f, err := newScatteredFixture()
	if err != nil {
		return nil, nil, err
	}
	f.step(f.h)
	return cpuOp(func(n int) error {
		for range n {
			f.step(f.h)
		}
		return nil
	}), f.close, nil
}
