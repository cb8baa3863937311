package steer

// The per-step batch: one call into the engine per step for a worker whose hidden states live
// on a device (or that applies steering with its own kernels).
//
// Stepper.Apply resolves the batch inside every (hook, layer) call: right for the native CPU
// kernels, which run in the engine anyway, but a GPU worker would cross into the engine at every
// hooked site. A Batch instead resolves the whole step once, in Resolve, into tables in the
// shape of the reference vLLM fork's gather-add (its steering table layout):
//
//   - slots: every distinct (steering set, phase) composition in the batch gets a slot, stable
//     from step to step while a request with it is in the batch (requests admitted with the
//     same steering share one, as the fork's config rows do); a request with no steering of its own gets
//     the global slot of its phase, and a row that nothing steers gets slot 0. Slot s is row s of
//     every site's device table [slots + 1, hidden], and row 0 is zeros.
//   - Index: the slot of every row of the step's block, the one per-token index a worker
//     uploads per step and every site shares.
//   - Updates: the (site, slot) rows whose content changed since the worker last uploaded them
//     (a new slot, a new version of the request or global composition whose action hash at that
//     site differs), with the composed vector (global + request, summed in float32 here, so one
//     row per token as the fork's table rows are) in Stage, and its clamps (global first, then
//     the request's, the order Apply uses) in ClampDirs/ClampParams. A worker copies exactly
//     these rows; a steady batch has none.
//   - Sites: the (hook, layer) sites something in this step's batch steers, with the number of
//     clamp directions there. An unsteered site costs the worker nothing.
//   - Checksum: a determinism checksum over what the batch resolved (span layout, slots and the
//     action hashes of every steered site), comparable across ranks that resolve the same batch
//     at the same version. It covers what the tables hold, not the device's arithmetic.
//
// Resolve validates everything and plans every change before it changes any slot, so bad input
// (a bad span, more compositions than MaxSlots, more clamps at a site than MaxClamps) returns a
// typed error and leaves the slots as they were: the device tables stay consistent with them.
//
// A later per-step product (capture selections: which sites' rows a consumer wants back) is one
// more list of the same Resolve, keyed by site like Sites; the slot and row machinery is shared.

import (
	"fmt"
	"math"
	"slices"
)

// BatchOptions sizes a Batch's tables.
type BatchOptions struct {
	// MaxSlots is the number of compositions a device table holds besides row 0 (default 256):
	// the distinct (request, phase) pairs of one step's batch must fit.
	MaxSlots int
	// MaxClamps is the number of clamp directions a (slot, site) may carry: 0 means the
	// default, 4 (the reference fork's max_clamp_directions), and a negative value none (tables
	// without clamp rows: a clamp in the batch is ErrBatchCapacity).
	MaxClamps int
	// MaxGateSlots is the number of distinct probe gates a gate table holds besides row 0
	// (default 64, at most MaxGates×MaxBatchSlots); MaxRowGates the probe gates one request of a
	// step may carry, the gate columns per row (0 means the default, 4, a negative value none;
	// at most MaxGates). See batch_gates.go.
	MaxGateSlots, MaxRowGates int
}

// MaxBatchSlots bounds BatchOptions.MaxSlots.
const MaxBatchSlots = 1 << 16

// BatchUpdate is one row a worker writes to its device tables: row Slot of site Site's table
// gets Stage[i*Hidden:(i+1)*Hidden] (i is the update's index), and, when Clamps > 0, its clamp
// rows get ClampDirs/ClampParams records [ClampStart, ClampStart+Clamps); clamp rows past Clamps
// become no-ops (zero direction, zero strength).
type BatchUpdate struct {
	Site, Slot         int32
	Clamps, ClampStart int32
}

// BatchStats counts a Batch's work.
type BatchStats struct {
	Resolves  uint64 // successful Resolve calls
	Updates   uint64 // rows reported for upload
	Evictions uint64 // slots reassigned from a composition no longer in the batch
}

// slotKey names a slot's content: the digest of the request's steering set (requests admitted
// with the same steering share a slot, as the fork's config rows are shared by config hash; a
// zero digest is the global slot) and the phase.
type slotKey struct {
	set   Digest
	phase Phase
	gate  uint64 // what the request's gates do to its rows as a whole (gateSig; 0: nothing)
}

type slotState struct {
	key  slotKey
	live bool   // key is assigned
	used uint64 // resolve tick that last used it
	// What the worker's tables hold for this slot (all zero: row 0's content): per site the
	// global and request action hashes, and the compositions' versions they were read at.
	g, r       []uint64
	gver, rver uint64
	rep        string // the request whose composition (at version rver) the slot was synced from
	synced     bool
	steered    []int32 // sites with content
	nclamps    []int32 // clamps at each of steered
	sum        uint64  // checksum contribution of the slot's content
}

// Batch resolves a Stepper's whole step at once: see the comment above. It belongs to the
// Stepper's goroutine. The slices it returns are valid until the next Resolve.
type Batch struct {
	s      *Stepper
	opt    BatchOptions
	nsites int
	slots  []slotState // index 0: the zero row, never assigned
	byKey  map[slotKey]int32
	free   []int32 // unassigned slots, highest first (lowest popped first)
	tick   uint64
	stats  BatchStats
	mask   []bool  // sites the worker applies (nil: all)
	sites  []int32 // the same, as SetSites listed them (nil: all)

	// Results of the last Resolve.
	Index       []int32 // slot of every row
	Sites       []int32 // steered sites (hook*layers + layer), ascending
	SiteClamps  []int32 // clamp directions at each of Sites (the most any slot of the step has)
	Updates     []BatchUpdate
	Stage       []float32 // len(Updates) × Hidden
	ClampDirs   []float32 // clamp records × Hidden (unit directions)
	ClampParams []float32 // clamp records × 3: lo, hi, strength
	NumSlots    int       // highest slot of this step + 1: rows a table needs
	Checksum    uint64
	Version     uint64 // region version resolved
	// The step's capture plan (empty unless the Stepper captures: SetCapture): the sites
	// whose rows the worker copies for capture consumers, ascending; the rows of
	// CaptureSites[i] are CaptureRows[CaptureStart[i]:CaptureStart[i+1]], block rows grouped
	// per request, to gather before that site's steering add and hand back with Capture.
	CaptureSites, CaptureStart, CaptureRows []int32
	Gates                                   BatchGates
	gate                                    batchGates

	// sums caches ResolveNative's content sums (batch_native.go).
	sums map[slotKey]keySum

	// scratch
	local    map[slotKey]int32
	taken    map[int32]bool
	clampAt  []int32
	spanSlot []int32
	keys     []slotKey
	rep      []int32 // per key: the span whose request's composition it is read from
	plan     []planned
	mark     []uint64
	nextG    []uint64
	nextR    []uint64
}

type planned struct {
	slot  int32
	evict bool
	diff  bool
	// new content, filled when diff
	steered, nclamps []int32
	g, r             []uint64
	sum              uint64
}

// NewBatch makes a Batch over s's steps.
func (s *Stepper) NewBatch(opt BatchOptions) (*Batch, error) {
	if opt.MaxSlots == 0 {
		opt.MaxSlots = 256
	}
	switch {
	case opt.MaxClamps == 0:
		opt.MaxClamps = 4
	case opt.MaxClamps < 0:
		opt.MaxClamps = 0
	}
	if opt.MaxGateSlots == 0 {
		opt.MaxGateSlots = 64
	}
	switch {
	case opt.MaxRowGates == 0:
		opt.MaxRowGates = 4
	case opt.MaxRowGates < 0:
		opt.MaxRowGates = 0
	}
	if opt.MaxSlots < 1 || opt.MaxSlots > MaxBatchSlots || opt.MaxClamps > 64 || opt.MaxGateSlots < 1 || opt.MaxGateSlots > MaxGates*MaxBatchSlots || opt.MaxRowGates > MaxGates {
		return nil, fmt.Errorf("%w: batch MaxSlots %d (1..%d), MaxClamps %d (at most 64), MaxGateSlots %d (1..%d) or MaxRowGates %d (at most %d)", ErrBadConfig, opt.MaxSlots, MaxBatchSlots, opt.MaxClamps, opt.MaxGateSlots, MaxGates*MaxBatchSlots, opt.MaxRowGates, MaxGates)
	}
	b := &Batch{s: s, opt: opt, nsites: s.e.cfg.NumHooks() * s.layers, byKey: map[slotKey]int32{},
		local: map[slotKey]int32{}, taken: map[int32]bool{}}
	b.slots = make([]slotState, opt.MaxSlots+1)
	for i := opt.MaxSlots; i >= 1; i-- {
		b.free = append(b.free, int32(i))
	}
	b.mark = make([]uint64, b.nsites)
	b.clampAt = make([]int32, b.nsites)
	b.gate.init(opt.MaxGateSlots, b.nsites)
	return b, nil
}

// Options returns the batch's options (defaults filled in).
func (b *Batch) Options() BatchOptions { return b.opt }

// Stats returns the counters.
func (b *Batch) Stats() BatchStats { return b.stats }

// SetSites restricts the batch to the sites (hook*layers + layer) the worker applies steering
// at (nil or empty: every site): other sites are never staged, reported in Sites or counted in
// the checksum, so a worker hooking 32 of 160 sites uploads and tracks only those. A site added
// later starts as zeros (a new table) and its rows are reported at the next Resolve.
func (b *Batch) SetSites(sites []int32) error {
	for _, s := range sites {
		if s < 0 || int(s) >= b.nsites {
			return fmt.Errorf("%w: site %d, the model has %d (hooks × layers)", ErrLayerRange, s, b.nsites)
		}
	}
	var mask []bool
	if len(sites) > 0 {
		mask = make([]bool, b.nsites)
		for _, s := range sites {
			mask[s] = true
		}
	}
	for i := range b.slots {
		sl := &b.slots[i]
		sl.synced = false
		if sl.g == nil {
			continue
		}
		for site := range b.nsites {
			if mask != nil && !mask[site] || b.mask != nil && !b.mask[site] {
				// Dropped sites are forgotten; added ones hold zeros (a new table).
				sl.g[site], sl.r[site] = 0, 0
			}
		}
	}
	b.mask = mask
	b.sites = nil
	if mask != nil {
		b.sites = slices.Clone(sites)
	}
	clear(b.sums)
	b.gate.setSites(mask)
	return nil
}

// AppliedSites lists the sites SetSites restricted the batch to (nil: every site). The caller
// must not modify it.
func (b *Batch) AppliedSites() []int32 { return b.sites }

// Reset forgets what the worker's tables hold: the next Resolve reports every steered row of
// its batch for upload (after the worker reallocated its tables, say).
func (b *Batch) Reset() {
	for i := range b.slots {
		b.slots[i] = slotState{}
	}
	clear(b.byKey)
	clear(b.sums)
	b.gate.reset()
	b.free = b.free[:0]
	for i := b.opt.MaxSlots; i >= 1; i-- {
		b.free = append(b.free, int32(i))
	}
}

// Resolve begins a step of the Stepper at version (0: the current one), as Begin does, and
// resolves batch, a layout of a block of rows rows, into the fields above. The step stays open
// (the Stepper's Apply may run in it, for sites applied on the CPU) until End or the next
// Begin/Resolve. On error the step is ended and the slots are unchanged.
func (b *Batch) Resolve(version uint64, batch []Span, rows int) error {
	s := b.s
	if rows < 0 {
		return fmt.Errorf("%w: %d rows", ErrShape, rows)
	}
	if b.gate.awaiting { // the last step's scores never came: its probes did not fire
		s.stats.GateReportsMissed++
		b.finishGates()
	}
	if err := s.Begin(version); err != nil {
		return err
	}
	if err := s.resolve(batch, rows); err != nil {
		s.End()
		return err
	}
	if err := b.planSlots(batch); err != nil {
		s.End()
		return err
	}
	if err := b.planGates(batch); err != nil {
		s.End()
		return err
	}
	b.commit(batch, rows)
	b.commitGates(rows)
	b.planBatchCapture()
	return nil
}

// planSlots assigns slots to the spans and computes the updates, without changing any slot.
func (b *Batch) planSlots(batch []Span) error {
	s := b.s
	b.tick++
	b.spanSlot = b.spanSlot[:0]
	b.keys = b.keys[:0]
	b.rep = b.rep[:0]
	b.plan = b.plan[:0]
	b.Updates = b.Updates[:0]
	b.Stage = b.Stage[:0]
	b.ClampDirs = b.ClampDirs[:0]
	b.ClampParams = b.ClampParams[:0]
	// keys[i] is the i-th distinct key of the step; plan[i] its slot.
	local := b.local
	clear(local)
	for i := range batch {
		sp, st := &batch[i], s.cur[i]
		var gsig uint64 // gated decode rows: what their gates do to them as a whole
		if st.gates != nil && sp.Phase == PhaseDecode && sp.Start < sp.End {
			gsig = gateSig(st.gates)
		}
		var k slotKey
		switch {
		case sp.Start == sp.End:
			b.spanSlot = append(b.spanSlot, -1)
			continue
		case st.view.sites != 0:
			k = slotKey{st.view.digest, sp.Phase, gsig}
		case s.global.sites != 0 || gsig != 0:
			k = slotKey{Digest{}, sp.Phase, gsig}
		default:
			b.spanSlot = append(b.spanSlot, -1)
			continue
		}
		j, ok := local[k]
		if !ok {
			j = int32(len(b.keys))
			local[k] = j
			b.keys = append(b.keys, k)
			b.rep = append(b.rep, int32(i))
		} else if sl, ok := b.byKey[k]; ok && b.slots[sl].rep == sp.ID {
			b.rep[j] = int32(i) // the request the slot was synced from: no diff needed
		}
		b.spanSlot = append(b.spanSlot, j)
	}
	if len(b.keys) > b.opt.MaxSlots {
		return fmt.Errorf("%w: the batch has %d distinct (request, phase) compositions, the tables hold %d: raise max_slots or split the batch", ErrBatchCapacity, len(b.keys), b.opt.MaxSlots)
	}
	// Slots: the key's own, else a free one, else the least recently used slot no key of this
	// step holds.
	nfree := len(b.free)
	taken := b.taken
	clear(taken)
	for _, k := range b.keys {
		if sl, ok := b.byKey[k]; ok {
			taken[sl] = true
		}
	}
	for _, k := range b.keys {
		p := planned{slot: -1}
		if j := len(b.plan); j < cap(b.plan) { // the last steps' site lists, reused: no allocation a step
			old := b.plan[:j+1][j]
			p.steered, p.nclamps = old.steered[:0], old.nclamps[:0]
		}
		if sl, ok := b.byKey[k]; ok {
			p.slot = sl
		} else if nfree > 0 {
			nfree--
			p.slot = b.free[nfree]
			taken[p.slot] = true
		} else {
			best := int32(-1)
			for i := 1; i < len(b.slots); i++ {
				if !taken[int32(i)] && (best < 0 || b.slots[i].used < b.slots[best].used) {
					best = int32(i)
				}
			}
			p.slot, p.evict = best, true
			taken[best] = true
		}
		b.plan = append(b.plan, p)
	}
	for j, k := range b.keys {
		if err := b.diff(j, k); err != nil {
			return err
		}
	}
	return nil
}

// diff compares the content key k has now with what slot plan[j] holds, and stages the rows
// that differ.
func (b *Batch) diff(j int, k slotKey) error {
	s := b.s
	p := &b.plan[j]
	sl := &b.slots[p.slot]
	var rv *composedView
	var repID string
	var gs *gateState // the gates' part of the rows (k.gate != 0)
	if k.set != (Digest{}) {
		st := s.cur[b.rep[j]]
		rv, repID = &st.view, st.id
	}
	if k.gate != 0 {
		gs = s.cur[b.rep[j]].gates
	}
	gver, rver := s.global.version, uint64(0)
	if rv != nil {
		rver = rv.version
	}
	if sl.live && sl.key == k && sl.synced && sl.gver == gver && sl.rep == repID && sl.rver == rver {
		return nil
	}
	p.diff = true
	p.g = b.grow(&b.nextG, j)
	p.r = b.grow(&b.nextR, j)
	p.steered, p.nclamps = p.steered[:0], p.nclamps[:0]
	d := s.d
	var sum uint64
	for site := 0; site < b.nsites; site++ {
		if b.mask != nil && !b.mask[site] {
			p.g[site], p.r[site] = 0, 0
			continue
		}
		ix := site*2 + int(k.phase) - 1 // its site entry
		gv, gcl, ga := s.global.at(ix)
		var rvec []float32
		var rcl []byte
		var ra uint64
		if rv != nil {
			rvec, rcl, ra = rv.at(ix)
		}
		if gs != nil {
			ra = gateSiteHash(gs, site, ra)
		}
		p.g[site], p.r[site] = ga, ra
		n := (len(gcl) + len(rcl)) / clampRec
		if ga != 0 || ra != 0 {
			if n > b.opt.MaxClamps {
				hook := site / s.layers
				return fmt.Errorf("%w: %d clamp directions at (%s, layer %d, %s) for %q, the tables hold %d: raise max_clamps", ErrBatchCapacity, n, s.e.cfg.HookName(HookID(hook)), site%s.layers, k.phase, repID, b.opt.MaxClamps)
			}
			p.steered = append(p.steered, int32(site))
			p.nclamps = append(p.nclamps, int32(n))
			sum = mix64(mix64(sum, uint64(site)), mix64(ga, ra))
		}
		var oldG, oldR uint64
		if sl.g != nil {
			oldG, oldR = sl.g[site], sl.r[site]
		}
		if oldG == ga && oldR == ra {
			continue
		}
		u := BatchUpdate{Site: int32(site), Slot: p.slot, Clamps: int32(n), ClampStart: int32(len(b.ClampParams) / 3)}
		o := len(b.Stage)
		b.Stage = slices.Grow(b.Stage, d)[:o+d] // (not append of a make: that allocates under -race)
		row := b.Stage[o : o+d]
		clear(row)
		switch {
		case gs != nil:
			gateRow(row, gs, site, rvec, gv)
		case gv != nil && rvec != nil:
			for i := range row {
				row[i] = rvec[i] + gv[i]
			}
		case rvec != nil:
			copy(row, rvec)
		case gv != nil:
			copy(row, gv)
		}
		b.stageClamps(&s.global, gcl)
		if rv != nil {
			b.stageClamps(rv, rcl)
		}
		b.Updates = append(b.Updates, u)
	}
	p.sum = sum
	return nil
}

// grow returns scratch row j of buf (nsites words).
func (b *Batch) grow(buf *[]uint64, j int) []uint64 {
	n := (j + 1) * b.nsites
	if len(*buf) < n {
		*buf = append(*buf, make([]uint64, n-len(*buf))...)
	}
	return (*buf)[j*b.nsites : n : n]
}

func (b *Batch) stageClamps(v *composedView, cl []byte) {
	for ; len(cl) >= clampRec; cl = cl[clampRec:] {
		o := int(le.Uint32(cl[12:])) * v.stride
		b.ClampDirs = append(b.ClampDirs, v.data[o:o+v.d]...)
		b.ClampParams = append(b.ClampParams, math.Float32frombits(le.Uint32(cl)), math.Float32frombits(le.Uint32(cl[4:])), math.Float32frombits(le.Uint32(cl[8:])))
	}
}

// commit applies the plan to the slots and fills Index, Sites and Checksum.
func (b *Batch) commit(batch []Span, rows int) {
	s := b.s
	nfree := len(b.free)
	for j, k := range b.keys {
		p := &b.plan[j]
		sl := &b.slots[p.slot]
		if !(sl.live && sl.key == k) {
			if p.evict {
				delete(b.byKey, sl.key)
				b.stats.Evictions++
			} else {
				nfree--
			}
			sl.key, sl.live = k, true
			b.byKey[k] = p.slot
		}
		sl.used = b.tick
		if p.diff {
			if sl.g == nil {
				sl.g, sl.r = make([]uint64, b.nsites), make([]uint64, b.nsites)
			}
			copy(sl.g, p.g)
			copy(sl.r, p.r)
			sl.steered = append(sl.steered[:0], p.steered...)
			sl.nclamps = append(sl.nclamps[:0], p.nclamps...)
			sl.sum = p.sum
			sl.gver = s.global.version
			sl.rver, sl.rep = 0, ""
			if k.set != (Digest{}) {
				st := s.cur[b.rep[j]]
				sl.rver, sl.rep = st.view.version, st.id
			}
			sl.synced = true
		}
	}
	b.free = b.free[:nfree]
	b.stats.Resolves++
	b.stats.Updates += uint64(len(b.Updates))
	b.Version = s.Version()

	if cap(b.Index) < rows {
		b.Index = make([]int32, rows)
	}
	b.Index = b.Index[:rows]
	clear(b.Index)
	// Sites: union of the step's slots' steered sites, with the most clamps any has there.
	b.Sites, b.SiteClamps = b.Sites[:0], b.SiteClamps[:0]
	stamp := b.tick
	b.NumSlots = 1
	for j := range b.keys {
		sl := &b.slots[b.plan[j].slot]
		b.NumSlots = max(b.NumSlots, int(b.plan[j].slot)+1)
		for x, site := range sl.steered {
			if b.mark[site] != stamp {
				b.mark[site], b.clampAt[site] = stamp, 0
			}
			b.clampAt[site] = max(b.clampAt[site], sl.nclamps[x])
		}
	}
	var sum uint64
	for i := range batch {
		j := b.spanSlot[i]
		if j < 0 {
			continue
		}
		slot := b.plan[j].slot
		sp := &batch[i]
		for r := sp.Start; r < sp.End; r++ {
			b.Index[r] = slot
		}
		x := mix64(sum, s.cur[i].idHash)
		x = mix64(x, uint64(sp.Start)<<32|uint64(sp.End))
		x = mix64(x, uint64(sp.Phase))
		sum = mix64(x, b.slots[slot].sum)
	}
	b.Checksum = sum
	for site := 0; site < b.nsites; site++ {
		if b.mark[site] == stamp {
			b.Sites = append(b.Sites, int32(site))
			b.SiteClamps = append(b.SiteClamps, b.clampAt[site])
		}
	}
}
