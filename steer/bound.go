package steer

// Bound steps: a worker that applies one batch at every (hook, layer) of a step binds it once.
//
// Apply takes the batch at every call and compares it with the one it resolved (sameBatch),
// because a caller may change its spans between two calls; it then walks the resolved spans,
// reading each steered request's site entry, right after the previous site's adds have
// streamed the hidden state and vectors through the L1. On a sparse decode step (4 steered
// rows of 64) the comparison and the walk are a tenth of the step.
//
// Bind resolves the step's batch once, copying it (the caller may reuse its spans at once),
// and, when the batch is one ungated row per span (a decode batch), plans every site at once:
// per site, the runs of rows to add with their vectors (adjacent pool cells for adjacent rows
// merged, as Apply merges them) and the action words the checksum folds. ApplyBound then adds a
// site's runs with nothing to look up. A site the global composition steers, or where a span
// has clamps, and every site of a batch with gated or multi-row spans, is applied by Apply's
// own walk of the bound plan. Both give the same bits and the same checksum as Apply.

import (
	"fmt"

	"github.com/shmsteer/shmsteer/kernels"
)

// boundSite is one site's part of the bound plan: runs [lo, hi) of Stepper.bruns and checksum
// entries [alo, ahi) of Stepper.bacts; walk means the site is applied by Apply's walk.
type boundSite struct {
	lo, hi, alo, ahi int32
	colRuns, runRows int32 // the runs of two rows or more, and their rows (Stats)
	walk             bool
}

// boundRun is rows [start, start+n) of the block getting v (n rows of Hidden floats).
type boundRun struct {
	v        []float32
	start, n int
	col      int // first pool column of v, or -1 (a vector not in the pool: never merged)
}

// boundAct is a steered span of a site, for the checksum: its plan index and action word.
type boundAct struct {
	p   int
	act uint64
}

// Bind resolves batch, the spans of a block of rows rows, as this step's batch, for
// ApplyBound. It validates it as Apply does (ErrBadBatch, ErrUnknownRequest with
// Options.StrictRequests; ErrShape for rows out of range); on error h is not involved and the
// step has no batch bound. Bind keeps a copy: the caller may change its spans at once. The
// binding lasts until End, the next Bind, or an Apply with another batch.
func (s *Stepper) Bind(batch []Span, rows int) error {
	if !s.open {
		return ErrNoStep
	}
	s.bound = false
	if rows < 0 || rows > MaxPromptLen {
		return fmt.Errorf("%w: a block of %d rows (0..%d)", ErrShape, rows, MaxPromptLen)
	}
	if err := s.resolve(batch, rows); err != nil {
		return err
	}
	if !s.samePlan() {
		s.planBound()
	}
	s.boundRows, s.bound = rows, true
	return nil
}

// boundKey is what a planned site's runs and checksum entries depend on, per span of the plan:
// its rows and phase, and the composition its request's view reads (an entry's version names
// its bytes and the pool cells it names: any change rewrites it under a new version).
type boundKey struct {
	st             *reqState
	id             string
	ver            uint64
	start, end, ph int
	known, gated   bool
}

// samePlan reports whether the resolved plan is the one the sites were last planned for, with
// the same compositions and the same global one (a decode batch whose requests stay in their
// rows from step to step): its runs and checksum entries are then still right. Otherwise it
// records the plan's key for the planning that follows.
func (s *Stepper) samePlan() bool {
	same := s.bplanned && len(s.bkey) == len(s.plan) && s.bglobal == s.global.version && s.bglobalSites == s.global.sites && s.bplanRuns == s.planRuns
	if same {
		for i := range s.plan {
			p, k := &s.plan[i], &s.bkey[i]
			if p.st != k.st || p.st.view.version != k.ver || p.st.known != k.known || p.start != k.start || p.end != k.end || p.ph != k.ph || p.gated != k.gated || p.st.id != k.id {
				same = false
				break
			}
		}
	}
	if same {
		return true
	}
	s.bkey = s.bkey[:0]
	for i := range s.plan {
		p := &s.plan[i]
		s.bkey = append(s.bkey, boundKey{st: p.st, id: p.st.id, ver: p.st.view.version, start: p.start, end: p.end, ph: p.ph, known: p.st.known, gated: p.gated})
	}
	s.bglobal, s.bglobalSites, s.bplanRuns, s.bplanned = s.global.version, s.global.sites, s.planRuns, true
	return false
}

// ApplyBound is Apply with the batch bound by Bind: h must be the bound block, rows × Hidden
// floats (ErrShape). ErrNoStep when the step has no bound batch. The result, the checksum and
// the stats are Apply's with that batch.
func (s *Stepper) ApplyBound(hook HookID, layer int, h []float32) error {
	if !s.open {
		return ErrNoStep
	}
	if !s.bound {
		return fmt.Errorf("%w: ApplyBound with no batch bound in this step (call Bind after Begin; an Apply with another batch unbinds it)", ErrNoStep)
	}
	if s.dev != nil && s.dev.gate.awaiting {
		s.dev.cancelGates() // a native Apply in a device-path step: the Stepper gates it
	}
	if int(hook) >= s.hooks {
		return fmt.Errorf("%w: hook id %d", ErrUnknownHook, hook)
	}
	if layer < 0 || layer >= s.layers {
		return fmt.Errorf("%w: layer %d, model has %d", ErrLayerRange, layer, s.layers)
	}
	d := s.d
	if len(h) != s.boundRows*d {
		return fmt.Errorf("%w: %d floats, the bound block is %d rows of %d", ErrShape, len(h), s.boundRows, d)
	}
	cell := int(hook)*s.layers + layer
	bs := &s.bsites[cell]
	if bs.walk || s.cap.on {
		s.applyPlan(hook, layer, h)
		return nil
	}
	s.stats.Applies++
	s.stats.ColumnRuns += uint64(bs.colRuns)
	s.stats.RunRows += uint64(bs.runRows)
	// Apply's checksum: mix64 of the site, the span's fixed words, 0 for the global act word
	// (a planned site has no global steering) and the request's. It reads nothing the adds
	// write, so it goes first: its chain of multiplies runs while the first add starts.
	sum := s.sum
	hl := (uint64(hook)<<32 | uint64(layer)) * mixK1
	for _, a := range s.bacts[bs.alo:bs.ahi] {
		p := &s.plan[a.p]
		x := mixPre(sum, hl)
		x = mixPre(x, p.idMul)
		x = mixPre(x, p.rowsMul)
		x = mixPre(x, p.phaseMul)
		x = mixPre(x, 0)
		sum = mix64(x, a.act)
	}
	s.sum = sum
	runs := s.bruns[bs.lo:bs.hi]
	for i := range runs {
		// planBound took v (n rows of d floats) from a composition at the step's version,
		// and resolve checked every span against the bound rows.
		r := &runs[i]
		start := r.start * d
		kernels.Axpy(h[start:start+r.n*d], 1, r.v)
	}
	return nil
}

// planBound plans every site of the resolved batch for ApplyBound (see the comment above).
func (s *Stepper) planBound() {
	n := s.hooks * s.layers
	if cap(s.bsites) < n {
		s.bsites = make([]boundSite, n)
	}
	s.bsites = s.bsites[:n]
	s.bruns, s.bacts = s.bruns[:0], s.bacts[:0]
	for cell := range s.bsites {
		if !s.planRuns || !s.planSite(cell) {
			s.bsites[cell] = boundSite{walk: true}
		}
	}
}

// planSite appends cell's runs and checksum entries and records them in s.bsites[cell], or
// reports false (the site is walked by Apply) when the global composition steers it or a span
// has clamps there.
func (s *Stepper) planSite(cell int) bool {
	site := cell * 2
	if s.global.sites != 0 {
		for ph := range 2 {
			if v, cl, act := s.global.at(site + ph); v != nil || len(cl) != 0 || act != 0 {
				return false
			}
		}
	}
	lo, alo := len(s.bruns), len(s.bacts)
	for i := range s.plan {
		p := &s.plan[i]
		v, cl, act := p.st.view.at(site + p.ph)
		if act == 0 {
			continue
		}
		if len(cl) != 0 {
			s.bruns, s.bacts = s.bruns[:lo], s.bacts[:alo]
			return false
		}
		s.bacts = append(s.bacts, boundAct{p: i, act: act})
		if v == nil {
			continue
		}
		col := p.st.view.colOf(site + p.ph)
		if k := len(s.bruns) - 1; k >= lo && col >= 0 {
			if r := &s.bruns[k]; r.col >= 0 && col == r.col+r.n && p.start == r.start+r.n {
				r.n++
				continue
			}
		}
		s.bruns = append(s.bruns, boundRun{v: v, start: p.start, n: 1, col: col})
	}
	bs := boundSite{lo: int32(lo), hi: int32(len(s.bruns)), alo: int32(alo), ahi: int32(len(s.bacts))}
	for i := lo; i < len(s.bruns); i++ {
		if r := &s.bruns[i]; r.n > 1 {
			// planRuns implies Stepper.runs: cells of exactly Hidden floats, so n adjacent
			// columns of one cell are n rows.
			r.v = s.e.pool.CellsFloat32(r.col, r.n, cell)
			bs.colRuns++
			bs.runRows += int32(r.n)
		}
	}
	s.bsites[cell] = bs
	return true
}
