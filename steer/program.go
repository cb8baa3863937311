package steer

// The step's program: what Apply and ApplyBound run at a site.
//
// A batch layout, resolved (Stepper.resolve: the steered spans in Stepper.steered), is turned into
// a list of operations per site, each site's built at its first apply and kept while the
// layout and every composition it read keep their versions (an entry's version names its bytes
// and the pool cells it names: any change rewrites it under a new version), so a decode batch
// whose requests stay in their rows builds each site once and then only runs it, step after
// step. A site's program is, in span order:
//
//   - folds: one per span the site steers (a global or request action word, or gates), the
//     checksum words; a gated span's fold carries its gated operation (gatedOp), run in order
//     with the folds since its probes and adds fold their own words into the checksum;
//   - adds: a run of one-row spans whose vectors are adjacent cells of the column pool, for
//     adjacent rows (one Axpy over the block), a span's vector added to each of its rows
//     (request or global alone), or the request + global pair;
//   - clamps: a span's global clamps, then its request's, after its adds.
//
// The executor (Stepper.exec) captures the site's rows first (before any add), folds, adds,
// clamps: the bits and the checksum of the old walk of the steered spans (kept as the test oracle,
// oracle_test.go), whatever the order of the adds of distinct spans (spans do not overlap, and
// a span's gates and clamps read only its own rows).

import (
	"github.com/shmsteer/shmsteer/kernels"
	"github.com/shmsteer/shmsteer/shm"
)

// program is the resolved layout's operations per site (see the comment above).
type program struct {
	sites  []siteProg // per site, hook*layers + layer; current when its gen is gen
	gen    uint64
	adds   []addOp
	folds  []foldOp
	gated  []gatedOp
	clamps []clampOp
	// What the current generation was built for: per steered span, its rows, phase and
	// the composition its request's view read; the global composition.
	key         []progKey
	global      uint64
	globalSites int
	valid       bool
}

// siteProg is one site's part of the program: [lo, hi) of each list.
type siteProg struct {
	gen              uint64
	addLo, addHi     int32
	foldLo, foldHi   int32
	clampLo, clampHi int32
	colRuns, runRows int32 // the runs of two rows or more, and their rows (Stats)
	gated            bool  // a fold carries a gated operation
}

// addOp adds to rows [start, end): addRun v (end-start rows of Hidden floats, adjacent pool
// cells) in one pass; addRows v to each row; addPair v + g to each row.
type addOp struct {
	v, g       []float32
	start, end int32
	col        int32 // addRun: v's first pool column
	kind       uint8
}

const (
	addRun uint8 = iota
	addRows
	addPair
)

// foldOp is a steered span of a site, for the checksum: its index in Stepper.steered, its
// gated operation (-1: none) and the global and request action words, multiplied by mixK1.
type foldOp struct {
	p, gated int32
	gaM, raM uint64
}

// gatedOp is a gated decode span at a site: its vectors and clamps there, applied with the
// attenuation its gates decide in the step.
type gatedOp struct {
	rv, g    []float32
	rcl, gcl []byte
}

// clampOp is a span's clamps at a site, global first.
type clampOp struct {
	p        int32
	gcl, rcl []byte
}

// progKey is what a site's program depends on, per steered span.
type progKey struct {
	st             *reqState
	id             string
	ver            uint64
	start, end, ph int
	known, gated   bool
}

// reuseProgram reports whether the resolved steered spans are the ones the program was built
// for, with the same compositions and the same global one (a decode batch whose requests stay
// in their rows from step to step): its sites are then still right. Otherwise it starts a new
// generation of the program for these spans: every site is built again at its next apply.
func (s *Stepper) reuseProgram() bool {
	pr := &s.prog
	same := pr.valid && len(pr.key) == len(s.steered) && pr.global == s.global.version && pr.globalSites == s.global.sites
	if same {
		for i := range s.steered {
			p, k := &s.steered[i], &pr.key[i]
			if p.st != k.st || p.st.view.version != k.ver || p.st.known != k.known || p.start != k.start || p.end != k.end || p.ph != k.ph || p.gated != k.gated || p.st.id != k.id {
				same = false
				break
			}
		}
	}
	if same {
		return true
	}
	pr.key = pr.key[:0]
	for i := range s.steered {
		p := &s.steered[i]
		pr.key = append(pr.key, progKey{st: p.st, id: p.st.id, ver: p.st.view.version, start: p.start, end: p.end, ph: p.ph, known: p.st.known, gated: p.gated})
	}
	pr.global, pr.globalSites, pr.valid = s.global.version, s.global.sites, true
	pr.gen++
	pr.adds, pr.folds, pr.gated, pr.clamps = pr.adds[:0], pr.folds[:0], pr.gated[:0], pr.clamps[:0]
	return false
}

// foldSpan folds a steered span of a site into the checksum sum: mix64 of the site (hl: hook<<32
// | layer, times mixK1), the request, its rows, its phase and the two action words (global,
// request; times mixK1). The checksum's one fold of a span; the gates fold their decisions
// in gates_step.go.
func foldSpan(sum, hl uint64, p *steeredSpan, gaM, raM uint64) uint64 {
	x := mixPre(sum, hl)
	x = mixPre(x, p.idMul)
	x = mixPre(x, p.rowsMul)
	x = mixPre(x, p.phaseMul)
	x = mixPre(x, gaM)
	return mixPre(x, raM)
}

// exec runs site (hook, layer)'s program over h, the checked block of the resolved batch:
// capture, then the folds (with the gated spans), the adds and the clamps.
func (s *Stepper) exec(hook HookID, layer int, h []float32) {
	s.stats.Applies++
	if s.cap.on {
		s.captureSite(hook, layer, shm.Float32Bytes(h), CaptureF32, false) // before the adds
	}
	pr := &s.prog
	site := int(hook)*s.layers + layer
	sp := &pr.sites[site]
	if sp.gen != pr.gen {
		s.build(site)
	}
	s.stats.ColumnRuns += uint64(sp.colRuns)
	s.stats.RunRows += uint64(sp.runRows)
	// The folds read nothing the adds write, so they go first: their chain of multiplies runs
	// while the first add starts. A gated span's gates read and add to its own rows only.
	hl := (uint64(hook)<<32 | uint64(layer)) * mixK1
	folds := pr.folds[sp.foldLo:sp.foldHi]
	sum := s.sum
	if sp.gated {
		for i := range folds {
			f := &folds[i]
			p := &s.steered[f.p]
			if f.gated >= 0 {
				s.sum = sum
				s.runGated(&pr.gated[f.gated], p, site, h)
				sum = s.sum
			}
			sum = foldSpan(sum, hl, p, f.gaM, f.raM)
		}
	} else {
		for i := range folds {
			f := &folds[i]
			sum = foldSpan(sum, hl, &s.steered[f.p], f.gaM, f.raM)
		}
	}
	s.sum = sum
	d := s.d
	adds := pr.adds[sp.addLo:sp.addHi]
	for i := range adds {
		a := &adds[i]
		if i+1 < len(adds) && !kernels.Follows(a.v, adds[i+1].v) {
			// A vector in its own entry (a full pool) lies megabytes from the one before:
			// its pages are asked for while this add runs; adjacent cells the hardware
			// prefetcher streams, and prefetching them only competes with it.
			kernels.PrefetchPages(adds[i+1].v)
		}
		blk := h[int(a.start)*d : int(a.end)*d]
		switch a.kind {
		case addRun:
			kernels.Axpy(blk, 1, a.v)
		case addRows:
			kernels.AddRows(blk, d, 1, a.v)
		default:
			// Both in one pass over the rows: a span of one row adds the two sources in one
			// kernel; a longer span sums them once into a row of scratch, in the pass over
			// its first row, and adds that, which reads one source stream per row instead of
			// two. Both round as h + (r + g).
			if a.end-a.start == 1 {
				kernels.AddRows2(blk, d, 1, a.v, 1, a.g)
			} else {
				kernels.SumAddRows(blk, d, 1, a.v, 1, a.g, s.pair)
			}
		}
	}
	for _, c := range pr.clamps[sp.clampLo:sp.clampHi] {
		p := &s.steered[c.p]
		s.clamp(p, h[p.start*d:p.end*d], c.gcl, c.rcl)
	}
}

// clamp runs a span's global clamps gcl, then its request's rcl, over its rows blk.
func (s *Stepper) clamp(p *steeredSpan, blk []float32, gcl, rcl []byte) {
	if len(gcl) != 0 {
		s.global.applyClamps(blk, s.d, gcl)
	}
	if len(rcl) != 0 {
		p.st.view.applyClamps(blk, s.d, rcl)
	}
}

// runGated applies a gated decode span at site (hook*layers + layer): its probes read before
// its steering, the request's vector times the attenuation, the global one, the gates' adds,
// the clamps.
func (s *Stepper) runGated(g *gatedOp, p *steeredSpan, site int, h []float32) {
	d := s.d
	blk := h[p.start*d : p.end*d]
	f := s.gatesBefore(p.st.gates, site, blk, p.start)
	switch {
	case g.rv != nil && g.g != nil:
		if p.end-p.start == 1 {
			kernels.AddRows2(blk, d, f, g.rv, 1, g.g)
		} else {
			kernels.SumAddRows(blk, d, f, g.rv, 1, g.g, s.pair)
		}
	case g.rv != nil:
		kernels.AddRows(blk, d, f, g.rv)
	case g.g != nil:
		kernels.AddRows(blk, d, 1, g.g)
	}
	s.gatesAdd(p.st.gates, site, blk, p.start, f)
	s.clamp(p, blk, g.gcl, g.rcl)
}

// build makes site's program (site: hook*layers + layer) for the current generation from
// the steered spans.
func (s *Stepper) build(site int) {
	pr := &s.prog
	ent := site * 2 // the site's first site entry (prefill; decode is ent + 1)
	// The global composition's site entries at this site, one per phase (nil when there is none).
	var gv [2][]float32
	var gcl [2][]byte
	var gAct [2]uint64
	if s.global.sites != 0 {
		gv[0], gcl[0], gAct[0] = s.global.at(ent)
		gv[1], gcl[1], gAct[1] = s.global.at(ent + 1)
	}
	sp := siteProg{gen: pr.gen, addLo: int32(len(pr.adds)), foldLo: int32(len(pr.folds)), clampLo: int32(len(pr.clamps))}
	spans := s.steered
	// Each span's site entry is asked for siteAhead spans ahead: every request's lies in its
	// own entry of the region.
	for n := range min(siteAhead, len(spans)) {
		spans[n].st.view.prefetchSite(ent + spans[n].ph)
	}
	lastRun := -1
	for i := range spans {
		p := &spans[i]
		if i+siteAhead < len(spans) {
			q := &spans[i+siteAhead]
			q.st.view.prefetchSite(ent + q.ph)
		}
		rv, rcl, rAct := p.st.view.at(ent + p.ph)
		g, gc, ga := gv[p.ph], gcl[p.ph], gAct[p.ph]
		if ga == 0 && rAct == 0 && !p.gated {
			continue
		}
		f := foldOp{p: int32(i), gated: -1, gaM: ga * mixK1, raM: rAct * mixK1}
		if p.gated {
			f.gated, sp.gated = int32(len(pr.gated)), true
			pr.gated = append(pr.gated, gatedOp{rv: rv, g: g, rcl: rcl, gcl: gc})
			pr.folds = append(pr.folds, f)
			continue
		}
		pr.folds = append(pr.folds, f)
		a := addOp{v: rv, start: int32(p.start), end: int32(p.end), col: -1, kind: addRows}
		joined := false
		switch {
		case rv != nil && g != nil:
			a.g, a.kind = g, addPair
		case rv != nil:
			// A one-row span whose vector is the cell after the last run's, for the row after
			// its last, joins it: the run is one block of rows and one of vectors.
			if !s.runs || p.end-p.start != 1 || len(gc) != 0 || len(rcl) != 0 {
				break
			}
			col := p.st.view.colOf(ent + p.ph)
			if col < 0 {
				break
			}
			if lastRun >= 0 {
				if r := &pr.adds[lastRun]; col == int(r.col+r.end-r.start) && int32(p.start) == r.end {
					r.end++
					joined = true
					break
				}
			}
			a.col, a.kind = int32(col), addRun
		case g != nil:
			a.v = g
		}
		if a.v != nil && !joined {
			if a.kind == addRun {
				lastRun = len(pr.adds)
			}
			pr.adds = append(pr.adds, a)
		}
		if len(gc) != 0 || len(rcl) != 0 {
			pr.clamps = append(pr.clamps, clampOp{p: int32(i), gcl: gc, rcl: rcl})
		}
	}
	sp.addHi, sp.foldHi, sp.clampHi = int32(len(pr.adds)), int32(len(pr.folds)), int32(len(pr.clamps))
	for i := sp.addLo; i < sp.addHi; i++ {
		if r := &pr.adds[i]; r.kind == addRun && r.end-r.start > 1 {
			// Stepper.runs: cells of exactly Hidden floats, so n adjacent columns of one cell
			// are n rows. A composition's column holds site s's vector in the pool's cell s.
			n := r.end - r.start
			r.v = s.e.pool.CellsFloat32(int(r.col), int(n), site)
			sp.colRuns++
			sp.runRows += n
		}
	}
	pr.sites[site] = sp
}
