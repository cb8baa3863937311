package steer

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/bits"
	"slices"

	"github.com/shmsteer/shmsteer/kernels"
	"github.com/shmsteer/shmsteer/shm"
)

// Span is one request's rows in a hidden-state block: rows [Start, End) belong to request ID,
// in phase Phase (PhasePrefill or PhaseDecode). Spans of one batch must not overlap.
type Span struct {
	ID         string
	Start, End int
	Phase      Phase
}

// StepStats counts a Stepper's work.
type StepStats struct {
	Steps       uint64 // Begin calls
	Applies     uint64 // Apply calls
	Recomposes  uint64 // effective-vector sets rebuilt because an entry they use changed
	MissingRefs uint64 // references to named vectors that were not registered when composed
	// UnknownRequests counts, once per step per request id, spans naming a request with no
	// admitted entry (never admitted, already ended, or a mistyped id): their rows get only the
	// global steering (or ErrUnknownRequest with Options.StrictRequests).
	UnknownRequests uint64
}

// Stepper applies steering to hidden states, one step at a time: Begin pins a snapshot, Apply
// runs for each (hook, layer), End unpins. It keeps process-private caches of every request's
// effective vectors, so it is used by one goroutine at a time; make one per goroutine.
type Stepper struct {
	e      *Engine
	d      int
	layers int
	sites  int // hooks × layers × 2 phases

	snap  shm.Snapshot
	open  bool
	step  uint64
	sum   uint64
	stats StepStats

	global comp
	gen    uint64 // bumped when global is recomposed
	reqs   map[string]*reqState
	free   []*reqState
	cur    []*reqState // per span of the current Apply, reused
}

// comp is a composed steering set: per site-phase index i = ((hook*layers)+layer)*2 + phase-1,
// the offset of its effective vector in vecs (-1: none of its own), its clamps
// clamps[cl[2i]:cl[2i+1]] and the hash of the actions it contributes there.
type comp struct {
	ver    uint64 // version of the region entry it was built from (0: none)
	digest Digest
	deps   []dep
	slot   []int32
	cl     []int32
	act    []uint64
	vecs   []float32
	clamps []clampAct
	dirs   []float32
	has    bool // any vector or clamp at all
}

type dep struct {
	name string
	ver  uint64 // 0: was missing
}

type clampAct struct {
	site        int32
	dir         int32 // offset in dirs
	lo, hi, str float32
	hash        uint64
}

type reqState struct {
	comp
	id     string
	idHash uint64
	seen   uint64 // step it was last validated in
	gen    uint64 // global generation it was composed against
}

// NewStepper makes a Stepper for this engine's region.
func (e *Engine) NewStepper() *Stepper {
	c := e.cfg
	return &Stepper{e: e, d: c.Hidden, layers: c.Layers, sites: c.NumHooks() * c.Layers * 2, reqs: map[string]*reqState{}}
}

// Begin starts a step at region version (0: the current one). Ranks handed the same version
// apply the same steering whatever is written meanwhile. The step's checksum starts at zero.
func (s *Stepper) Begin(version uint64) error {
	if s.open {
		s.End()
	}
	var err error
	if version == 0 {
		s.snap, err = s.e.r.Snapshot()
	} else {
		s.snap, err = s.e.r.SnapshotAt(version)
	}
	if err != nil {
		return err
	}
	s.open = true
	s.step++
	s.stats.Steps++
	s.sum = 0
	if s.step%64 == 0 {
		s.evictIdle()
	}
	if err := s.validateGlobal(); err != nil {
		s.End()
		return err
	}
	return nil
}

// Version is the region version of the current step (0 outside a step).
func (s *Stepper) Version() uint64 {
	if !s.open {
		return 0
	}
	return s.snap.Version()
}

// Checksum is the determinism checksum of the actions applied since Begin: every process that
// applies the same steering state to the same batch layouts gets the same value.
func (s *Stepper) Checksum() uint64 { return s.sum }

// End finishes the step, unpins its snapshot and returns its checksum.
func (s *Stepper) End() uint64 {
	if s.open {
		s.snap.Close()
		s.open = false
	}
	return s.sum
}

// Stats returns the counters.
func (s *Stepper) Stats() StepStats { return s.stats }

// Hidden is the model's hidden size: the row length of the blocks Apply takes.
func (s *Stepper) Hidden() int { return s.d }

// Close ends any open step and drops the caches.
func (s *Stepper) Close() {
	s.End()
	s.reqs, s.free = map[string]*reqState{}, nil
}

// Apply adds the effective steering (global base + global phase + request base + request
// phase) of each span's request to its rows of h, a T×Hidden row-major block for (hook,
// layer), then applies the clamps there, in place. Rows outside every span are untouched. It
// allocates nothing once each request's steering is composed. Every argument is checked before
// h is modified.
func (s *Stepper) Apply(hook HookID, layer int, h []float32, batch []Span) error {
	if !s.open {
		return ErrNoStep
	}
	d := s.d
	if int(hook) >= s.e.cfg.NumHooks() {
		return fmt.Errorf("%w: hook id %d", ErrUnknownHook, hook)
	}
	if layer < 0 || layer >= s.layers {
		return fmt.Errorf("%w: layer %d, model has %d", ErrLayerRange, layer, s.layers)
	}
	if len(h)%d != 0 {
		return fmt.Errorf("%w: %d floats is not a multiple of hidden size %d", ErrShape, len(h), d)
	}
	rows := len(h) / d
	s.cur = s.cur[:0]
	for i := range batch {
		sp := &batch[i]
		if sp.Phase != PhasePrefill && sp.Phase != PhaseDecode {
			return fmt.Errorf("%w: span %d (%q) has phase %d (%s): set Span.Phase to PhasePrefill (1) or PhaseDecode (2)", ErrBadBatch, i, sp.ID, uint8(sp.Phase), sp.Phase)
		}
		if sp.ID == "" || len(sp.ID) > MaxIDLen || sp.Start < 0 || sp.Start > sp.End || sp.End > rows {
			return fmt.Errorf("%w: span %d (%q rows [%d, %d)) in a block of %d rows", ErrBadBatch, i, sp.ID, sp.Start, sp.End, rows)
		}
		st, err := s.request(sp.ID)
		if err != nil {
			return err
		}
		s.cur = append(s.cur, st)
	}
	s.stats.Applies++
	g := &s.global
	site := (int(hook)*s.layers + layer) * 2
	for i := range batch {
		sp, st := &batch[i], s.cur[i]
		if sp.Start == sp.End {
			continue
		}
		ix := site + int(sp.Phase) - 1
		var vec []float32
		var gAct, rAct uint64
		if g.has {
			gAct = g.act[ix]
			if o := g.slot[ix]; o >= 0 {
				vec = g.vecs[o : int(o)+d]
			}
		}
		if st.has {
			rAct = st.act[ix]
			if o := st.slot[ix]; o >= 0 {
				vec = st.vecs[o : int(o)+d] // composed on top of the global vector
			}
		}
		if gAct == 0 && rAct == 0 {
			continue
		}
		blk := h[sp.Start*d : sp.End*d]
		if vec != nil {
			kernels.AddRows(blk, d, 1, vec)
		}
		if g.has {
			g.applyClamps(blk, d, ix)
		}
		if st.has {
			st.applyClamps(blk, d, ix)
		}
		x := mix64(s.sum, uint64(hook)<<32|uint64(layer))
		x = mix64(x, st.idHash)
		x = mix64(x, uint64(sp.Start)<<32|uint64(sp.End))
		x = mix64(x, uint64(sp.Phase))
		x = mix64(x, gAct)
		s.sum = mix64(x, rAct)
	}
	return nil
}

func (c *comp) applyClamps(blk []float32, d, ix int) {
	for _, k := range c.clamps[c.cl[2*ix]:c.cl[2*ix+1]] {
		kernels.Clamp(blk, d, c.dirs[k.dir:int(k.dir)+d], k.lo, k.hi, k.str)
	}
}

// request returns the composed state of request id, validated against this step's snapshot.
func (s *Stepper) request(id string) (*reqState, error) {
	st := s.reqs[id]
	if st == nil {
		if n := len(s.free); n > 0 {
			st, s.free = s.free[n-1], s.free[:n-1]
		} else {
			st = &reqState{}
		}
		st.reset()
		st.id = id
		h := fnv.New64a()
		h.Write([]byte(id))
		st.idHash = h.Sum64()
		st.ver, st.gen = ^uint64(0), 0 // force a first composition
		s.reqs[st.id] = st
	}
	if st.seen == s.step {
		return st, nil
	}
	b, ver, err := s.snap.View(KindRequest, id)
	if errors.Is(err, shm.ErrNotFound) {
		s.stats.UnknownRequests++
		if s.e.opt.StrictRequests {
			return nil, fmt.Errorf("%w: %q has no entry at version %d (call Engine.Admit for every request in a batch, and End only after its last step)", ErrUnknownRequest, id, s.snap.Version())
		}
		b, ver, err = nil, 0, nil
	}
	if err != nil {
		return nil, fmt.Errorf("request %q: %w", id, err)
	}
	if ver != st.ver || (ver != 0 && st.gen != s.gen) || s.depsChanged(st.deps) {
		if err := s.compose(&st.comp, b, ver, &s.global); err != nil {
			return nil, fmt.Errorf("request %q: %w", id, err)
		}
		st.gen = s.gen
	}
	st.seen = s.step
	return st, nil
}

func (s *Stepper) validateGlobal() error {
	b, ver, err := s.snap.View(KindGlobal, globalKey)
	if errors.Is(err, shm.ErrNotFound) {
		b, ver, err = nil, 0, nil
	}
	if err != nil {
		return fmt.Errorf("global steering: %w", err)
	}
	if ver == s.global.ver && s.gen != 0 && !s.depsChanged(s.global.deps) {
		return nil
	}
	if err := s.compose(&s.global, b, ver, nil); err != nil {
		return fmt.Errorf("global steering: %w", err)
	}
	s.gen++
	return nil
}

// depsChanged reports whether a named vector a composition used has another version now.
func (s *Stepper) depsChanged(deps []dep) bool {
	for _, d := range deps {
		_, ver, err := s.snap.View(KindVector, d.name)
		if err != nil {
			ver = 0
		}
		if ver != d.ver {
			return true
		}
	}
	return false
}

func (c *comp) reset() {
	c.ver, c.digest, c.has = 0, Digest{}, false
	c.deps, c.vecs, c.clamps, c.dirs = c.deps[:0], c.vecs[:0], c.clamps[:0], c.dirs[:0]
}

// compose rebuilds c from the encoded entry b (nil: none) at version ver. A request's
// composition adds the global one at every site-phase it steers, so Apply makes a single pass
// over each row. Its own part is checked against MaxMagnitude first: on ErrOverflow (or any
// error) c is left empty and marked stale, so it is composed (and refused) again rather than
// applied.
func (s *Stepper) compose(c *comp, b []byte, ver uint64, global *comp) error {
	s.stats.Recomposes++
	c.reset()
	if err := s.composeInto(c, b, ver, global); err != nil {
		c.reset()
		c.ver = ^uint64(0) // never a region version: the next step recomposes
		return err
	}
	return nil
}

func (s *Stepper) composeInto(c *comp, b []byte, ver uint64, global *comp) error {
	c.ver = ver
	if b == nil {
		return nil
	}
	cfg := s.e.cfg
	w, err := decode(b, cfg, false)
	if err != nil {
		return err
	}
	c.digest = w.digest
	if len(c.slot) != s.sites {
		c.slot, c.cl, c.act = make([]int32, s.sites), make([]int32, 2*s.sites), make([]uint64, s.sites)
	}
	for i := range c.slot {
		c.slot[i], c.act[i] = -1, 0
	}
	clear(c.cl)
	c.has = true
	d := s.d
	target := func(ix int) []float32 {
		if c.slot[ix] < 0 {
			o := len(c.vecs)
			c.slot[ix] = int32(o)
			c.vecs = append(c.vecs, make([]float32, d)...)
		}
		o := int(c.slot[ix])
		return c.vecs[o : o+d]
	}
	phases := func(p Phase) []Phase {
		switch p {
		case PhasePrefill:
			return []Phase{PhasePrefill}
		case PhaseDecode:
			return []Phase{PhaseDecode}
		}
		return []Phase{PhasePrefill, PhaseDecode}
	}
	siteOf := func(hook HookID, layer int, p Phase) int { return (int(hook)*s.layers+layer)*2 + int(p) - 1 }
	// Each action hash names where a contribution came from: the entry's digest and the term's
	// index for inline data, the named vector's digest and the strength for references.
	for ti, v := range w.vecs {
		for _, p := range phases(v.phase) {
			ix := siteOf(v.hook, v.layer, p)
			kernels.Axpy(target(ix), v.scale, v.data)
			c.act[ix] = mix64(mix64(c.act[ix], digest64(c.digest)), uint64(ti)<<32|uint64(p))
		}
	}
	for _, r := range w.refs {
		nb, nver, err := s.snap.View(KindVector, r.name)
		if err != nil {
			if !errors.Is(err, shm.ErrNotFound) {
				return fmt.Errorf("named vector %q: %w", r.name, err)
			}
			// Unregistered since admission: the term no longer applies (last writer wins).
			s.stats.MissingRefs++
			c.deps = append(c.deps, dep{name: r.name})
			continue
		}
		c.deps = append(c.deps, dep{name: r.name, ver: nver})
		nw, err := decode(nb, cfg, false)
		if err != nil {
			return fmt.Errorf("named vector %q: %w", r.name, err)
		}
		for _, v := range nw.vecs {
			for _, p := range phases(r.phase) {
				ix := siteOf(v.hook, v.layer, p)
				kernels.Axpy(target(ix), r.strength*v.scale, v.data)
				c.act[ix] = mix64(mix64(c.act[ix], digest64(nw.digest)), uint64(math.Float32bits(r.strength))<<32|uint64(p))
			}
		}
	}
	if err := s.checkComposed(c); err != nil {
		return err
	}
	if global != nil && global.has {
		for ix, o := range c.slot {
			if g := global.slot[ix]; o >= 0 && g >= 0 {
				kernels.Axpy(c.vecs[o:int(o)+d], 1, global.vecs[g:int(g)+d])
			}
		}
	}
	for _, cl := range w.clamps {
		for _, p := range phases(cl.phase) {
			ix := siteOf(cl.hook, cl.layer, p)
			h := mix64(mix64(digest64(c.digest), uint64(math.Float32bits(cl.lo))<<32|uint64(math.Float32bits(cl.hi))), uint64(math.Float32bits(cl.str))<<32|uint64(p))
			c.clamps = append(c.clamps, clampAct{site: int32(ix), dir: int32(len(c.dirs)), lo: cl.lo, hi: cl.hi, str: cl.str, hash: h})
			c.dirs = append(c.dirs, cl.dir...)
		}
	}
	// Group clamps by site-phase, keeping their order within each, and fold them into act.
	slices.SortStableFunc(c.clamps, func(a, b clampAct) int { return int(a.site) - int(b.site) })
	for i, k := range c.clamps {
		ix := int(k.site)
		if c.cl[2*ix+1] == 0 {
			c.cl[2*ix] = int32(i)
		}
		c.cl[2*ix+1] = int32(i + 1)
		c.act[ix] = mix64(c.act[ix], k.hash)
	}
	// A request steering a site-phase with only clamps still needs a non-zero act there even
	// if hashing happened to give zero; a zero act means "nothing to do".
	for ix := range c.act {
		if c.act[ix] == 0 && (c.slot[ix] >= 0 || c.cl[2*ix+1] > c.cl[2*ix]) {
			c.act[ix] = 1
		}
	}
	return nil
}

// evictIdle recycles the state of requests not seen in the last 64 steps (they ended).
func (s *Stepper) evictIdle() {
	for id, st := range s.reqs {
		if s.step-st.seen > 64 {
			delete(s.reqs, id)
			s.free = append(s.free, st)
		}
	}
}

func digest64(d Digest) uint64 { return le.Uint64(d[:8]) }

// mix64 folds x into h (order-dependent), with the multiply-rotate rounds of xxhash.
func mix64(h, x uint64) uint64 {
	h ^= x * 0x9E3779B97F4A7C15
	return bits.RotateLeft64(h, 31) * 0xC2B2AE3D27D4EB4F
}
