package steer

// Plain sites: a site's adds, handed to a caller that runs them without entering Go.
//
// Most sites of a decode step only add: each steered span's vector (or its request's and the
// global one summed) to its rows, no gate, clamp or capture. For such a site the program
// (program.go) is a short list of adds whose vectors lie in the region's mapping, and it stays
// the same from step to step while its generation does. The C ABI keeps that list in C memory
// and runs it there (capi's plan.c), which spares the loop a crossing into the Go runtime at
// every site: PlainSite exports a site's adds, Replay records each apply made from them (the
// checksum fold and the stats Apply would have made), in the order they ran.

import "fmt"

// PlainKind says how a PlainAdd adds.
type PlainKind uint8

const (
	// PlainEach adds V (Hidden floats) to each row of [Start, End).
	PlainEach PlainKind = iota
	// PlainBlock adds V, (End-Start) rows of Hidden floats, row to row: adjacent cells of the
	// column pool, one per one-row span.
	PlainBlock
	// PlainPair adds V + G (each Hidden floats) to each row, rounded as h + (V + G).
	PlainPair
)

// PlainAdd is one add of a plain site: rows [Start, End) of the block get V (and G), as Kind
// says, each sum rounded to float32 once (h + v; h + (v + g)). V and G are views of the
// region's mapping, valid while the program's Generation is unchanged and a step is open.
type PlainAdd struct {
	V, G       []float32
	Start, End int
	Kind       PlainKind
}

// Generation names the step's program: the adds PlainSite returned hold while it is unchanged
// (a resolve of a batch whose steered spans keep their rows, phases and compositions, and the
// global composition its version, keeps it).
func (s *Stepper) Generation() uint64 { return s.prog.gen }

// PlainStep reports whether the open step's sites may be plain: a resolved batch, no capture,
// no device-path gates awaiting their scores.
func (s *Stepper) PlainStep() bool {
	return s.open && s.resolved && !s.cap.on && (s.devGates == nil || !s.devGates.awaiting)
}

// PlainSite appends to dst site (hook, layer)'s adds in the open step and reports true when
// adding them is all Apply would do to the block there (PlainStep, and no gated span or clamp
// at the site); false leaves dst as it was. The site's program is built if it was not. Adds
// of distinct spans touch distinct rows, so their order does not matter.
func (s *Stepper) PlainSite(dst []PlainAdd, hook HookID, layer int) ([]PlainAdd, bool) {
	if !s.PlainStep() || int(hook) >= s.hooks || layer < 0 || layer >= s.layers {
		return dst, false
	}
	pr := &s.prog
	site := int(hook)*s.layers + layer
	sp := &pr.sites[site]
	if sp.gen != pr.gen {
		s.build(site)
	}
	if sp.gated || sp.clampHi > sp.clampLo {
		return dst, false
	}
	for _, a := range pr.adds[sp.addLo:sp.addHi] {
		p := PlainAdd{V: a.v, Start: int(a.start), End: int(a.end), Kind: PlainEach}
		switch {
		case a.kind == addPair:
			p.G, p.Kind = a.g, PlainPair
		case a.kind == addRun && a.end-a.start > 1:
			p.Kind = PlainBlock
		}
		dst = append(dst, p)
	}
	return dst, true
}

// Replay records an apply of site (hook, layer) that the caller ran from PlainSite's adds in
// this step: the checksum fold and the stats Apply's run of the site makes (Applies,
// ColumnRuns, RunRows). Calls must come in the order the applies ran, between the Applies
// around them. ErrNoStep outside a step; ErrBadBatch when the site is not plain in the step's
// current program (its adds were not the ones PlainSite gives now).
func (s *Stepper) Replay(hook HookID, layer int) error {
	if !s.open {
		return ErrNoStep
	}
	if !s.PlainStep() || int(hook) >= s.hooks || layer < 0 || layer >= s.layers {
		return fmt.Errorf("%w: site (%d, %d) replayed outside a plain step", ErrBadBatch, hook, layer)
	}
	pr := &s.prog
	sp := &pr.sites[int(hook)*s.layers+layer]
	if sp.gen != pr.gen || sp.gated || sp.clampHi > sp.clampLo {
		return fmt.Errorf("%w: site (%d, %d) replayed without its plain program", ErrBadBatch, hook, layer)
	}
	s.stats.Applies++
	s.stats.ColumnRuns += uint64(sp.colRuns)
	s.stats.RunRows += uint64(sp.runRows)
	s.sum = s.foldSite(s.sum, hook, layer, sp)
	return nil
}

// foldSite is the checksum fold of an apply of site (hook, layer), program sp, from sum.
func (s *Stepper) foldSite(sum uint64, hook HookID, layer int, sp *siteProg) uint64 {
	hl := (uint64(hook)<<32 | uint64(layer)) * mixK1
	for _, f := range s.prog.folds[sp.foldLo:sp.foldHi] {
		sum = foldSpan(sum, hl, &s.steered[f.p], f.gaM, f.raM)
	}
	return sum
}

// PlainSum is the checksum End would return after Replay of sites (hook*layers + layer), in
// order, from the open step as it is now, and true; nothing of the step changes but the sites'
// programs, built when they were not (as PlainSite builds them). False when the step is not
// plain or a site is out of range or not plain in the current program. The C ABI arms the end
// of a native step with it at the resolve, so that a new batch's first step ends in C too.
func (s *Stepper) PlainSum(sites []uint32) (uint64, bool) {
	if !s.open || !s.PlainStep() {
		return 0, false
	}
	pr := &s.prog
	sum := s.sum
	for _, site := range sites {
		if int(site) >= len(pr.sites) {
			return 0, false
		}
		sp := &pr.sites[site]
		if sp.gen != pr.gen {
			s.build(int(site))
		}
		if sp.gated || sp.clampHi > sp.clampLo {
			return 0, false
		}
		sum = s.foldSite(sum, HookID(int(site)/s.layers), int(site)%s.layers, sp)
	}
	return sum, true
}

// CountSteps records k steps a caller ran outside Go after the last step (the C ABI begins
// and ends the steps of a steady native batch in C: capi's plan.c): each a native resolve of
// the batch this Batch resolved last, at the same version (so the same checksum), whose
// applies were sites (hook*layers + layer), in order, from PlainSite's adds of the program's
// current generation, ended with nothing but its pin released. The counters, and the requests'
// recency, move as Begin, ResolveNative, Replay and End would have moved them. ErrBadBatch in a
// step, or for a site not plain in the current program (nothing counted).
func (b *Batch) CountSteps(k uint64, sites []uint32) error {
	s := b.s
	if s.open || !s.resolved && len(s.cur) == 0 {
		return fmt.Errorf("%w: %d steps counted in a step or before any resolve", ErrBadBatch, k)
	}
	pr := &s.prog
	var runs, rows uint64
	for _, site := range sites {
		if int(site) >= len(pr.sites) {
			return fmt.Errorf("%w: site %d counted, the model has %d", ErrBadBatch, site, len(pr.sites))
		}
		sp := &pr.sites[site]
		if sp.gen != pr.gen || sp.gated || sp.clampHi > sp.clampLo {
			return fmt.Errorf("%w: site %d counted without its plain program", ErrBadBatch, site)
		}
		runs += uint64(sp.colRuns)
		rows += uint64(sp.runRows)
	}
	if k == 0 {
		return nil
	}
	before := s.step
	s.step += k
	s.stats.Steps += k
	s.stats.Applies += k * uint64(len(sites))
	s.stats.ColumnRuns += k * runs
	s.stats.RunRows += k * rows
	b.stats.Resolves += k
	for _, st := range s.cur {
		if st != nil {
			st.seen = s.step
		}
	}
	if s.step/64 != before/64 {
		s.evictIdle()
	}
	return nil
}
