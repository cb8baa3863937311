package steer

// Gates on the device path (a Batch). The gate semantics are the Stepper's (gates_step.go);
// what differs is where the work runs:
//
//   - What is known when the step begins goes into the slot tables: the request's attenuation
//     (an engaged attenuate gate scales its own steering and its gates' adds) and the adds of
//     engaged gates (next_step pulses, engaged rest_of_ gates, this_token gates with
//     when=always). A request whose gates change its rows gets the slot of (its steering, its
//     phase, what its gates add), so requests with the same engaged gates still share a slot;
//     a change of engagement is a new slot key, staged like any other.
//   - A probe read is a gate column. Each row of a gated request's decode span has one column
//     per probe gate of the request (Gates.Cols, the most any request of the step has), naming
//     a gate slot: the probe vector (times its scale) with its site, threshold and sharpness,
//     and, for a this_token add, the add's vectors at each site (times its strength), and a
//     factor (the request's attenuation). Gate slots are shared by content and kept from step
//     to step, so a steady batch uploads nothing for them either.
//   - The worker, per step: gate[t, k] = 0 and score[t, k] = 0; at each hooked site S in
//     forward order, before the site's gather-add, for every column whose slot j probes at S:
//     score[t, k] = h[t]·probe[j] and, when j gates rows, gate[t, k] = factor[t, k] ·
//     sigmoid(sharpness[j]·(score[t, k] − threshold[j])); then h[t] += table_S[index[t]]; then
//     h[t] += gate[t, k] ·
//     adds_S[j] for every column; then the clamps. At the step's end it hands score back
//     (Report), where the host-evaluated scopes decide on the rows' mean and advance, exactly
//     as the Stepper's End does, and the step's gate decisions are counted and summed
//     (Stepper.GateChecksum).
//
// A probe whose site the worker does not hook (SetSites) is never read, as in a native step
// that never applies that site. Prefill rows are never gated.

import (
	"fmt"
	"math"
)

// BatchGates is what a Resolve produced for the gates (see the comment above). Slices are
// valid until the next Resolve.
type BatchGates struct {
	Cols int // gate columns per row (0: no probe gate in the step)
	// Rows is rows × Cols: the gate slot each row's column reads (0: none); Factor, rows ×
	// Cols, what the gate value is multiplied by there (the request's attenuation: 1 unless an
	// attenuate gate is engaged), so requests damped differently still share a gate slot.
	Rows   []int32
	Factor []float32
	Slots  int // highest gate slot of the step + 1: the rows a gate table needs
	// Updates are the gate slots to (re)write, with their probe rows (len(Updates) × Hidden, the
	// probe vector times its scale) and parameters (len(Updates) × 2: threshold, sharpness).
	Updates []GateSlotUpdate
	Probe   []float32
	Params  []float32
	// Adds are the (site, gate slot) add rows to write (len(Adds) × Hidden in AddStage; zeros
	// where a reassigned slot's old content added and its new content does not).
	Adds     []GateAddUpdate
	AddStage []float32
	// Sites are the sites where this step's gate slots probe or add, ascending.
	Sites []int32
}

// GateSlotUpdate is one gate slot's new content: its probe reads at site ProbeSite (hook*layers +
// layer); PerRow is 1 when it gates rows (this_token), 0 when its score only goes back to the
// host (next_step, rest_of_request, rest_of_conversation).
type GateSlotUpdate struct {
	Slot, ProbeSite, PerRow, Pad int32
}

// GateAddUpdate is one add row of a gate slot at a site.
type GateAddUpdate struct {
	Site, Slot int32
}

// gateKey names a gate slot's content.
type gateKey struct {
	probe, steer  Digest
	thr, sharp, k uint32 // float32 bits; k is the add's strength
	perRow        bool
	probeSite     int32
}

type gateSlotState struct {
	key   gateKey
	live  bool
	used  uint64  // resolve tick that last used it
	sites []int32 // sites its add rows are non-zero at, ascending
}

// gateCol is one column of a planned gated span: the gate's index in its request and its
// local key.
type gateCol struct {
	gate int
	key  int32
}

type pendSpan struct {
	gs         *gateState
	start, end int
	col0, n    int     // its columns in cols
	factor     float32 // the request's attenuation in this step
}

// batchGates is a Batch's gate state.
type batchGates struct {
	byKey map[gateKey]int32
	slots []gateSlotState // index 0 unused
	// the step awaiting Report
	awaiting   bool
	rows, ncol int
	pend       []pendSpan
	cols       []gateCol
	states     []*gateState
	// plan scratch
	keys     []gateKey
	src      []gateCol // per key: the column it was first seen in (gate index)
	srcGS    []*gateState
	slotOf   []int32   // per key: its slot
	fresh    []bool    // per key: newly assigned (staged)
	newSites [][]int32 // per key: the sites its staged add rows are at
	local    map[gateKey]int32
	taken    map[int32]bool
	mark     []uint64
}

func (g *batchGates) init(maxSlots, nsites int) {
	g.mark = make([]uint64, nsites)
	g.byKey = map[gateKey]int32{}
	g.local = map[gateKey]int32{}
	g.taken = map[int32]bool{}
	g.slots = make([]gateSlotState, maxSlots+1)
}

// setSites makes every gate slot restage after the worker's sites changed, keeping the sites
// its add rows are at that the worker still applies (so they are zeroed when reassigned).
func (g *batchGates) setSites(mask []bool) {
	clear(g.byKey)
	for i := range g.slots {
		st := &g.slots[i]
		st.live = false
		keep := st.sites[:0]
		for _, site := range st.sites {
			if mask == nil || mask[site] {
				keep = append(keep, site)
			}
		}
		st.sites = keep
	}
}

func (g *batchGates) reset() {
	clear(g.byKey)
	for i := range g.slots {
		g.slots[i] = gateSlotState{}
	}
}

// engagedAdd reports whether gate i of gs adds to the rows as a whole in this step (not per
// row): an add engaged by its scope, or a this_token add with when=always.
func engagedAdd(gs *gateState, i int) bool {
	g := &gs.gates[i]
	return g.Apply == ApplyAdd && !(g.Scope == ScopeThisToken && g.When == WhenProbe) && gs.g[i].engaged(g)
}

// gateSig names what a gated request's gates do to its rows as a whole in this step: its
// attenuation and the adds engaged (0: nothing).
func gateSig(gs *gateState) uint64 {
	var x uint64
	any := false
	if f := gs.factor(); f != 1 {
		x, any = mix64(x, uint64(math.Float32bits(f))|1<<32), true
	}
	for i := range gs.g {
		if engagedAdd(gs, i) {
			g := &gs.gates[i]
			x, any = mix64(mix64(x, digest64(g.SteerDigest)), uint64(i)<<32|uint64(math.Float32bits(g.Strength))), true
		}
	}
	if !any {
		return 0
	}
	return x | 1
}

// gateSiteHash is a slot's request action hash at site with its gates' part folded in (ra when
// they change nothing there).
func gateSiteHash(gs *gateState, site int, ra uint64) uint64 {
	var x uint64
	if f := gs.factor(); f != 1 && ra != 0 {
		x = mix64(x, uint64(math.Float32bits(f))|1<<32)
	}
	for i := range gs.g {
		if !engagedAdd(gs, i) {
			continue
		}
		for _, a := range gs.g[i].adds {
			if a.site == site {
				g := &gs.gates[i]
				x = mix64(mix64(mix64(x, uint64(i)), digest64(g.SteerDigest)), uint64(math.Float32bits(g.Strength)))
				break
			}
		}
	}
	if x == 0 {
		return ra
	}
	return mix64(ra, x) | 1
}

// gateRow writes a gated slot's row at site: f × the request's vector + the global one + the
// engaged adds, in float32 in the order the Stepper adds them.
func gateRow(row []float32, gs *gateState, site int, rvec, gv []float32) {
	f := gs.factor()
	switch {
	case rvec != nil && gv != nil:
		for i := range row {
			row[i] = f*rvec[i] + gv[i]
		}
	case rvec != nil:
		for i := range row {
			row[i] = f * rvec[i]
		}
	case gv != nil:
		copy(row, gv)
	}
	for i := range gs.g {
		if !engagedAdd(gs, i) {
			continue
		}
		for _, a := range gs.g[i].adds {
			if a.site != site {
				continue
			}
			k := f * gs.gates[i].Strength * a.scale
			for x := range row {
				row[x] += k * a.data[x]
			}
		}
	}
}

// planGates plans the step's gate columns and slots, staging the slots that are new, without
// changing any slot. rows is the block's rows.
func (b *Batch) planGates(batch []Span) error {
	s := b.s
	g := &b.gate
	out := &b.Gates
	out.Cols, out.Slots = 0, 1
	out.Rows = out.Rows[:0]
	out.Updates, out.Probe, out.Params = out.Updates[:0], out.Probe[:0], out.Params[:0]
	out.Adds, out.AddStage, out.Sites = out.Adds[:0], out.AddStage[:0], out.Sites[:0]
	g.pend, g.cols = g.pend[:0], g.cols[:0]
	g.keys, g.src, g.srcGS, g.slotOf, g.fresh = g.keys[:0], g.src[:0], g.srcGS[:0], g.slotOf[:0], g.fresh[:0]
	clear(g.local)
	for i := range batch {
		sp, st := &batch[i], s.cur[i]
		if st.gates == nil || sp.Phase != PhaseDecode || sp.Start == sp.End {
			continue
		}
		gs := st.gates
		p := pendSpan{gs: gs, start: sp.Start, end: sp.End, col0: len(g.cols), factor: gs.factor()}
		for gi := range gs.gates {
			ag := &gs.gates[gi]
			site := gs.g[gi].probeSite
			if ag.When != WhenProbe || b.mask != nil && !b.mask[site] {
				continue
			}
			k := gateKey{probe: ag.ProbeDigest, thr: math.Float32bits(ag.Threshold), sharp: math.Float32bits(ag.Sharpness), probeSite: int32(site)}
			if ag.Scope == ScopeThisToken {
				k.perRow = true
				k.steer, k.k = ag.SteerDigest, math.Float32bits(ag.Strength)
			}
			j, ok := g.local[k]
			if !ok {
				j = int32(len(g.keys))
				g.local[k] = j
				g.keys = append(g.keys, k)
				g.src = append(g.src, gateCol{gate: gi})
				g.srcGS = append(g.srcGS, gs)
			}
			g.cols = append(g.cols, gateCol{gate: gi, key: j})
		}
		p.n = len(g.cols) - p.col0
		out.Cols = max(out.Cols, p.n)
		g.pend = append(g.pend, p)
	}
	if out.Cols > b.opt.MaxRowGates {
		return fmt.Errorf("%w: a request of the batch has %d probe gates, the gate tables hold %d per row: raise max_row_gates", ErrBatchCapacity, out.Cols, b.opt.MaxRowGates)
	}
	if len(g.keys) > b.opt.MaxGateSlots {
		return fmt.Errorf("%w: the batch has %d distinct probe gates, the gate tables hold %d: raise max_gate_slots or split the batch", ErrBatchCapacity, len(g.keys), b.opt.MaxGateSlots)
	}
	// Slots: the key's own, else an unassigned one, else the least recently used one no key of
	// this step holds.
	clear(g.taken)
	for _, k := range g.keys {
		if sl, ok := g.byKey[k]; ok {
			g.taken[sl] = true
		}
	}
	for len(g.newSites) < len(g.keys) {
		g.newSites = append(g.newSites, nil)
	}
	for j, k := range g.keys {
		sl, ok := g.byKey[k]
		if !ok {
			sl = -1
			for x := int32(1); x < int32(len(g.slots)); x++ {
				if g.taken[x] {
					continue
				}
				if !g.slots[x].live {
					sl = x
					break
				}
				if sl < 0 || g.slots[x].used < g.slots[sl].used {
					sl = x
				}
			}
			g.taken[sl] = true
		}
		g.slotOf = append(g.slotOf, sl)
		g.fresh = append(g.fresh, !ok)
		out.Slots = max(out.Slots, int(sl)+1)
		if !ok {
			b.stageGate(j, sl)
		}
	}
	return nil
}

// stageGate stages gate key j's content into slot sl: the probe row and parameters, its add
// rows at the sites the worker applies, and zero rows where the slot's old content added.
func (b *Batch) stageGate(j int, sl int32) {
	s, g, out := b.s, &b.gate, &b.Gates
	d := s.d
	k := g.keys[j]
	gs, gi := g.srcGS[j], g.src[j].gate
	ag := &gs.gates[gi]
	per := int32(0)
	if k.perRow {
		per = 1
	}
	out.Updates = append(out.Updates, GateSlotUpdate{Slot: sl, ProbeSite: k.probeSite, PerRow: per})
	o := len(out.Probe)
	out.Probe = append(out.Probe, ag.Probe.Data...)
	for x := o; x < len(out.Probe); x++ {
		out.Probe[x] *= ag.Probe.Scale
	}
	out.Params = append(out.Params, ag.Threshold, ag.Sharpness)
	old := g.slots[sl].sites
	sites := g.newSites[j][:0]
	a0 := len(out.Adds)
	if k.perRow && ag.Apply == ApplyAdd {
		f := math.Float32frombits(k.k) // the add's strength
		for _, a := range gs.g[gi].adds {
			if b.mask != nil && !b.mask[a.site] {
				continue
			}
			x := -1
			for y := a0; y < len(out.Adds); y++ {
				if out.Adds[y].Site == int32(a.site) {
					x = y
				}
			}
			if x < 0 {
				out.Adds = append(out.Adds, GateAddUpdate{Site: int32(a.site), Slot: sl})
				out.AddStage = append(out.AddStage, make([]float32, d)...)
				sites = append(sites, int32(a.site))
				x = len(out.Adds) - 1
			}
			row := out.AddStage[x*d : (x+1)*d]
			kk := f * a.scale
			for i := range row {
				row[i] += kk * a.data[i]
			}
		}
	}
	g.newSites[j] = sites
	for _, site := range old {
		if !containsSite(sites, site) {
			out.Adds = append(out.Adds, GateAddUpdate{Site: site, Slot: sl})
			out.AddStage = append(out.AddStage, make([]float32, d)...)
		}
	}
}

func containsSite(sites []int32, s int32) bool {
	for _, x := range sites {
		if x == s {
			return true
		}
	}
	return false
}

// commitGates applies the planned gate slots and fills Rows and Sites; the step then awaits
// its scores (Report).
func (b *Batch) commitGates(rows int) {
	s, g, out := b.s, &b.gate, &b.Gates
	for j, k := range g.keys {
		sl := g.slotOf[j]
		st := &g.slots[sl]
		if g.fresh[j] {
			if st.live {
				delete(g.byKey, st.key)
			}
			st.key, st.live = k, true
			g.byKey[k] = sl
			st.sites = append(st.sites[:0], g.newSites[j]...)
		}
		st.used = b.tick
	}
	n := rows * out.Cols
	if cap(out.Rows) < n {
		out.Rows = make([]int32, n)
	}
	out.Rows = out.Rows[:n]
	clear(out.Rows)
	if cap(out.Factor) < n {
		out.Factor = make([]float32, n)
	}
	out.Factor = out.Factor[:n]
	for i := range out.Factor {
		out.Factor[i] = 1
	}
	stamp := b.tick
	g.states = g.states[:0]
	for _, p := range g.pend {
		for c := range p.n {
			sl := g.slotOf[g.cols[p.col0+c].key]
			for r := p.start; r < p.end; r++ {
				out.Rows[r*out.Cols+c] = sl
				out.Factor[r*out.Cols+c] = p.factor
			}
			st := &g.slots[sl]
			b.markSite(st.key.probeSite, stamp)
			for _, site := range st.sites {
				b.markSite(site, stamp)
			}
		}
		gs := p.gs
		if gs.decodeStep != s.step {
			gs.decodeStep = s.step
			g.states = append(g.states, gs)
			for i := range gs.g {
				if gs.gates[i].When == WhenAlways && gs.gates[i].Scope != ScopeThisToken {
					gs.g[i].fired = true
				}
			}
		}
	}
	for site := range b.nsites {
		if g.mark[site] == stamp {
			out.Sites = append(out.Sites, int32(site))
		}
	}
	g.awaiting, g.rows, g.ncol = len(g.states) > 0, rows, out.Cols
	if g.awaiting {
		s.devGates = g
	}
}

// cancel hands the awaiting step's gates to the Stepper: a native Apply runs in it, and the
// Stepper's End advances them.
func (g *batchGates) cancel() {
	for _, gs := range g.states {
		gs.decodeStep = 0
	}
	clear(g.states)
	g.states = g.states[:0]
	g.awaiting = false
}

func (b *Batch) markSite(site int32, stamp uint64) { b.gate.mark[site] = stamp }

// Report hands the step's probe scores back: scores is rows × Gates.Cols float32, score[t, k]
// = h[t]·probe of row t's column k at its probe site (see the comment above; entries of column
// slot 0 are ignored). The step's host-evaluated gates decide (on the mean of a request's
// rows) and advance to the next step, the this_token decisions are counted, and the step's
// gate decisions go into Stepper.GateChecksum, as a native step's End does. A step with gated
// decode rows and no probe columns takes Report(nil). Call it once per resolved step, before
// the next Resolve; a step never reported counts in StepStats.GateReportsMissed and its probe
// gates are taken as not fired. ErrNoStep when no step awaits, ErrShape for a wrong length
// (nothing changes).
func (b *Batch) Report(scores []float32) error {
	g := &b.gate
	if !g.awaiting {
		return fmt.Errorf("%w: no device-path step awaits its gate scores (Report once per Resolve that had gated decode rows)", ErrNoStep)
	}
	if len(scores) != g.rows*g.ncol {
		return fmt.Errorf("%w: %d gate scores, the step has %d rows × %d gate columns", ErrShape, len(scores), g.rows, g.ncol)
	}
	s := b.s
	for _, p := range g.pend {
		gs := p.gs
		for c := range p.n {
			col := g.cols[p.col0+c]
			ag := &gs.gates[col.gate]
			s.countEval(ag.Scope)
			sharp, thr := float64(ag.Sharpness), float64(ag.Threshold)
			if ag.Scope == ScopeThisToken {
				for r := p.start; r < p.end; r++ {
					v := sigmoid(sharp * (float64(scores[r*g.ncol+c]) - thr))
					s.rowDecision(gs, col.gate, r-p.start, v > 0.5)
				}
				continue
			}
			var sum float64
			for r := p.start; r < p.end; r++ {
				sum += float64(scores[r*g.ncol+c])
			}
			s.hostDecision(gs, col.gate, sigmoid(sharp*(sum/float64(p.end-p.start)-thr)) > 0.5)
		}
	}
	b.finishGates()
	return nil
}

// AwaitsReport reports whether the last Resolve had gated decode rows, so the step awaits
// Report.
func (b *Batch) AwaitsReport() bool { return b.gate.awaiting }

// finishGates advances the awaiting step's gated requests.
func (b *Batch) finishGates() {
	g := &b.gate
	for _, gs := range g.states {
		b.s.advance(gs)
	}
	clear(g.states)
	g.states = g.states[:0]
	g.awaiting = false
}
