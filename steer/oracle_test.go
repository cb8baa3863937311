package steer

// The test oracle: the step's walk as Apply ran it before the program (program.go), kept to
// compare the executor with (FuzzStepMatchesOracle, TestStepMatchesOracle). oracleApply is the
// old Apply: the same checks, the batch resolved by the Stepper's own resolve, then the walk of
// the plan (oracleWalk, with oracleRuns for a decode batch at a site without global steering).
// One change from the old walk: a gated span never joins a run of adjacent cells (its gate adds
// used to come before the run's add when its attenuation was 1; addRun's doc said it never
// joins one), so a gated row gets its steering, then its gates' adds, at every site.

import (
	"fmt"

	"github.com/shmsteer/shmsteer/kernels"
	"github.com/shmsteer/shmsteer/shm"
)

// oracleApply is the old Stepper.Apply.
func (s *Stepper) oracleApply(hook HookID, layer int, h []float32, batch []Span) error {
	if !s.open {
		return ErrNoStep
	}
	if s.devGates != nil && s.devGates.awaiting {
		s.devGates.cancel()
	}
	d := s.d
	if int(hook) >= s.hooks {
		return fmt.Errorf("%w: hook id %d", ErrUnknownHook, hook)
	}
	if layer < 0 || layer >= s.layers {
		return fmt.Errorf("%w: layer %d, model has %d", ErrLayerRange, layer, s.layers)
	}
	if len(h)%d != 0 {
		return fmt.Errorf("%w: %d floats is not a multiple of hidden size %d", ErrShape, len(h), d)
	}
	rows := len(h) / d
	if !s.sameBatch(batch, rows) {
		if err := s.resolve(batch, rows); err != nil {
			return err
		}
	}
	s.oracleWalk(hook, layer, h)
	return nil
}

// oraclePlanRuns reports what the old resolve recorded as planRuns: the pool's cells are rows
// (Stepper.runs) and every span of the plan is one ungated row (a decode batch).
func oraclePlanRuns(s *Stepper) bool {
	if !s.runs {
		return false
	}
	for i := range s.steered {
		if p := &s.steered[i]; p.gated || p.end-p.start != 1 {
			return false
		}
	}
	return true
}

// oracleColAct returns site ix's act word and, when its vector is a cell of the region's pool
// and the site has no clamps, that column; else col is -1. A view without sites, or a site with
// act 0, has nothing to apply: act is 0.
func oracleColAct(v *composedView, ix int) (act uint64, col int) {
	if v.sites == 0 {
		return 0, -1
	}
	e := v.table[ix*siteEntry : ix*siteEntry+siteEntry]
	if act = le.Uint64(e[16:]); act == 0 {
		return 0, -1
	}
	if vi := le.Uint32(e); vi&colFlag != 0 && le.Uint32(e[4:]) == le.Uint32(e[8:]) {
		return act, int(v.cols[vi&1])
	}
	return act, -1
}

// oracleWalk is the old Apply at (hook, layer) once its arguments are checked and s.steered is
// the batch's: the general walk, which hands a decode batch's runs to oracleRuns.
func (s *Stepper) oracleWalk(hook HookID, layer int, h []float32) {
	d := s.d
	s.stats.Applies++
	if s.cap.on {
		s.captureSite(hook, layer, shm.Float32Bytes(h), CaptureF32, false) // before the adds
	}
	site := (int(hook)*s.layers + layer) * 2
	// The global composition's entries at this site, one per phase (nil when there is none).
	var gv [2][]float32
	var gcl [2][]byte
	var gAct [2]uint64
	if s.global.sites != 0 {
		gv[0], gcl[0], gAct[0] = s.global.at(site)
		gv[1], gcl[1], gAct[1] = s.global.at(site + 1)
	}
	// Request vectors are read one span ahead, their site entries siteAhead spans ahead.
	plan := s.steered
	if oraclePlanRuns(s) && gv[0] == nil && gv[1] == nil && len(gcl[0]) == 0 && len(gcl[1]) == 0 {
		// A batch of one-row, ungated spans at a site without global steering: the spans
		// whose vectors are cells of the pool are walked by oracleRuns; the rest of the plan,
		// from the first span that is not, by the loop below.
		n := s.oracleRuns(h, site, uint64(hook)<<32|uint64(layer))
		if n == len(plan) {
			return
		}
		plan = plan[n:]
	}
	for n := range min(siteAhead, len(plan)) {
		plan[n].st.view.prefetchSite(site + plan[n].ph)
	}
	var nv []float32
	var ncl []byte
	var nAct uint64
	var run oracleColRun
	if len(plan) > 0 {
		nv, ncl, nAct = plan[0].st.view.at(site + plan[0].ph)
	}
	for n := range plan {
		p := &plan[n]
		rv, rcl, rAct := nv, ncl, nAct
		if n+siteAhead < len(plan) {
			q := &plan[n+siteAhead]
			q.st.view.prefetchSite(site + q.ph)
		}
		if n+1 < len(plan) {
			q := &plan[n+1]
			nv, ncl, nAct = q.st.view.at(site + q.ph)
			if !kernels.Follows(rv, nv) {
				kernels.PrefetchPages(nv)
			}
		}
		g, gc, ga := gv[p.ph], gcl[p.ph], gAct[p.ph]
		if ga == 0 && rAct == 0 && !p.gated {
			continue
		}
		blk := h[p.start*d : p.end*d]
		f := float32(1) // the request's attenuation
		if p.gated {
			f = s.gatesBefore(p.st.gates, site/2, blk, p.start)
		}
		switch {
		case rv != nil && g != nil:
			// Both in one pass over the rows: a span of one row adds the two sources in one
			// kernel; a longer span sums them once into a row of scratch, in the pass over
			// its first row, and adds that, which reads one source stream per row instead of
			// two. Both round as h + (r + g).
			if p.end-p.start == 1 {
				kernels.AddRows2(blk, d, f, rv, 1, g)
			} else {
				kernels.SumAddRows(blk, d, f, rv, 1, g, s.pair)
			}
		case rv != nil:
			// A one-row span whose vector is the cell after the run's last, for the row after
			// the run's last, joins the run: the run is added in one pass when it ends.
			if s.runs && !p.gated && p.end-p.start == 1 && len(gc) == 0 && len(rcl) == 0 {
				if col := p.st.view.colOf(site + p.ph); col >= 0 {
					if run.n > 0 && col == run.col+run.n && p.start == run.end {
						run.n, run.end = run.n+1, run.end+1
					} else {
						s.oracleAddRun(h, &run)
						run.col, run.n, run.start, run.end, run.cell = col, 1, p.start, p.end, site/2
					}
					break
				}
			}
			kernels.AddRows(blk, d, f, rv)
		case g != nil:
			kernels.AddRows(blk, d, 1, g)
		}
		s.oracleAfter(p, site, blk, f, gc, rcl)
		s.oracleFold(p, hook, layer, ga, rAct)
	}
	s.oracleAddRun(h, &run)
}

// oracleFold folds one span into the checksum: mix64 of the site, the request, its rows, its
// phase and the two act words; the span's three fixed words were multiplied once, when the
// batch was resolved.
func (s *Stepper) oracleFold(p *steeredSpan, hook HookID, layer int, ga, rAct uint64) {
	x := mix64(s.sum, uint64(hook)<<32|uint64(layer))
	x = mixPre(x, p.idMul)
	x = mixPre(x, p.rowsMul)
	x = mixPre(x, p.phaseMul)
	x = mix64(x, ga)
	s.sum = mix64(x, rAct)
}

// oracleRuns is the old Apply's walk of the plan when oraclePlanRuns holds and the site has no
// global steering: every span is one ungated row, so a span either has nothing here (act 0:
// skipped, as Apply skips it) or adds its request's vector with nothing else. It reads each
// span's site entry once (colAct), joins vectors that are adjacent cells for adjacent rows into
// runs, adds each run when it ends and folds each span into the checksum as Apply does (the
// global act word is 0). It stops at the first span whose vector is not a cell of the pool, or
// that has clamps, after adding the runs before it, and returns that span's index in the plan
// (len(plan) when it walked them all), from which Apply's general loop goes on.
func (s *Stepper) oracleRuns(h []float32, site int, hookLayer uint64) int {
	plan := s.steered
	var run oracleColRun
	sum := s.sum
	hl := hookLayer * mixK1
	for n := range min(oracleRunAhead, len(plan)) {
		plan[n].st.view.prefetchSite(site + plan[n].ph)
	}
	for n := range plan {
		p := &plan[n]
		if n+oracleRunAhead < len(plan) {
			q := &plan[n+oracleRunAhead]
			q.st.view.prefetchSite(site + q.ph)
		}
		act, col := oracleColAct(&p.st.view, site+p.ph)
		if act == 0 {
			continue
		}
		if col < 0 {
			s.sum = sum
			s.oracleAddRun(h, &run)
			return n
		}
		if run.n > 0 && col == run.col+run.n && p.start == run.end {
			run.n, run.end = run.n+1, run.end+1
		} else {
			s.oracleAddRun(h, &run)
			// Field by field: a composite literal is built on the stack in overlapping 16-byte
			// stores and copied with overlapping loads, which stall on store forwarding.
			run.col, run.n, run.start, run.end, run.cell = col, 1, p.start, p.end, site/2
		}
		x := mixPre(sum, hl)
		x = mixPre(x, p.idMul)
		x = mixPre(x, p.rowsMul)
		x = mixPre(x, p.phaseMul)
		x = mixPre(x, 0) // the global act word
		sum = mix64(x, act)
	}
	s.sum = sum
	s.oracleAddRun(h, &run)
	return len(plan)
}

// oracleColRun is a run of one-row spans of an Apply whose vectors are adjacent cells of the column
// pool (columns col to col+n-1 at cell cell) and whose rows are adjacent (start to end): a
// decode batch in admission order. Its rows and its vectors are then each one block, added in
// one kernel call instead of one per row, with the same bits (each row gets h + 1·v).
type oracleColRun struct {
	col, n, cell, start, end int
}

// oracleAddRun adds the run r (if any) to its rows of h and empties it. Nothing else of the step
// reads those rows meanwhile: spans do not overlap, and each span's gates and clamps read its
// own rows (a span with clamps or gates never joins a run).
func (s *Stepper) oracleAddRun(h []float32, r *oracleColRun) {
	if r.n == 0 {
		return
	}
	d := s.d
	if r.n > 1 {
		s.stats.ColumnRuns++
		s.stats.RunRows += uint64(r.n)
	}
	v := s.e.pool.CellsFloat32(r.col, r.n, r.cell)
	// The pool's geometry was checked (Stepper.runs: cells of exactly d floats) and the run's
	// columns each hold a cell named by a composition at this step's version.
	kernels.Axpy(h[r.start*d:r.end*d], 1, v)
	*r = oracleColRun{}
}

// oracleRunAhead is how many spans ahead oracleRuns asks for a site entry: its walk spends a few ns a
// span (the adds come when a run ends), so an entry missed in cache needs asking for further
// ahead than Apply's siteAhead for the load to have arrived (by profile of the bench's decode
// step, 64 one-row spans: the walk's share of the step 1.9% at 4 ahead, 1.3% at 16).
const oracleRunAhead = 16

// oracleAfter is the old walk's work on a span after its adds: its gates' adds, its global
// clamps, its request's clamps.
func (s *Stepper) oracleAfter(p *steeredSpan, site int, blk []float32, f float32, gc, rcl []byte) {
	if p.gated {
		s.gatesAdd(p.st.gates, site/2, blk, p.start, f)
	}
	if len(gc) != 0 {
		s.global.applyClamps(blk, s.d, gc)
	}
	if len(rcl) != 0 {
		p.st.view.applyClamps(blk, s.d, rcl)
	}
}
