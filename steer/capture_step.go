package steer

// The hooks' side of capture: a Stepper with a CaptureSink (SetCapture) reads, per step, the
// capture entry of each request in its batch and plans, once per step with the batch layout,
// which rows of which sites it copies. A site's rows are copied before its steering is added
// (captures see the residual as the model computed it, as the fork's do), once per step and
// site, one record per (site, request): the union of the rows the request's consumers want
// there, with their absolute positions (Span.Pos + row). Consumers tell their rows apart by
// position. Nothing is allocated per step once the scratch has grown.

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"

	"github.com/shmsteer/shmsteer/shm"
)

// capReq is a request's capture entry as the Stepper uses it.
type capReq struct {
	ver       uint64
	promptLen int
	cons      []CapturePositions // per consumer (entry order)
	sites     []int32            // union of the consumers' sites, ascending
	masks     []uint16           // per site: the consumers capturing there
	distinct  []uint16           // the distinct masks
	maskIx    []int32            // per site: its mask's index in distinct
	group     []int32            // per distinct mask: its group in this step (-1: no rows)
}

// capGroup is one request span's rows captured at the sites of one mask.
type capGroup struct {
	id     string // the span's request id
	off, n int32  // into capStep.rows / pos
}

type capStep struct {
	on, want bool // capturing this step; capturing from the next Begin
	planned  bool // the plan below is the current batch's (planCapture succeeded)
	sink     CaptureSink
	flusher  CaptureFlusher // sink, when it holds records until Flush
	nsites   int

	groups     []capGroup
	rows, pos  []int   // per group, contiguous: block rows and their positions
	siteStart  []int32 // nsites+1 offsets into siteGroups (CSR by site)
	siteGroups []int32
	cursor     []int32
	pairs      [][2]int32 // (site, group) before the CSR
	done       []uint64   // per site: the step it was captured in
	scratch    []int
	iota       []int // 0, 1, 2, ...: the rows of a staged block
	rec        CaptureRecord
	lastErr    error
}

// SetCapture sets where this Stepper's hooks (and its Batches' Capture) copy the rows that
// admitted requests capture, from its next Begin: o.Sink, when this is the writing rank
// (o.Rank == o.WriterRank); a nil Sink or another rank captures nothing and reads no capture
// entries. ErrBadConfig for a negative rank.
func (s *Stepper) SetCapture(o CaptureOptions) error {
	if o.Rank < 0 || o.WriterRank < 0 {
		return fmt.Errorf("%w: capture rank %d, writer rank %d: ranks are ≥ 0", ErrBadConfig, o.Rank, o.WriterRank)
	}
	c := &s.cap
	c.want = o.Sink != nil && o.Rank == o.WriterRank
	c.sink, c.flusher = o.Sink, nil
	if !c.want {
		c.sink = nil
	}
	c.flusher, _ = c.sink.(CaptureFlusher)
	return nil
}

// Capturing reports whether this step captures (SetCapture took effect at its Begin).
func (s *Stepper) Capturing() bool { return s.open && s.cap.on }

// CaptureErr is the last error a sink returned (nil if none): those errors are counted in
// StepStats.CaptureErrors and never fail a step.
func (s *Stepper) CaptureErr() error { return s.cap.lastErr }

// beginCapture applies SetCapture at a step's start.
func (s *Stepper) beginCapture() {
	c := &s.cap
	if c.on != c.want {
		c.on = c.want
		for _, st := range s.reqs {
			st.seen = 0 // re-read: the capture entries are read only while capturing
		}
	}
	c.groups, c.planned = c.groups[:0], false
	if c.on && c.done == nil {
		c.nsites = s.e.cfg.NumHooks() * s.layers
		c.done = make([]uint64, c.nsites)
		c.siteStart = make([]int32, c.nsites+1)
		c.cursor = make([]int32, c.nsites)
	}
}

// readCapture reads request st's capture entry at the step's version (only while capturing).
func (s *Stepper) readCapture(st *reqState) error {
	if !s.cap.on {
		st.cap = nil
		return nil
	}
	b, ver, err := s.snap.View(KindCapture, st.id)
	if errors.Is(err, shm.ErrNotFound) {
		st.cap = nil
		return nil
	} else if err != nil {
		return fmt.Errorf("request %q capture: %w", st.id, err)
	}
	if st.cap != nil && st.cap.ver == ver {
		return nil
	}
	rc, err := decodeCapture(b, s.cap.nsites)
	if err != nil {
		return fmt.Errorf("request %q: %w", st.id, err)
	}
	cr := &capReq{ver: ver, promptLen: rc.PromptLen}
	var pairs [][2]int32 // (site, consumer)
	for j := range rc.Consumers {
		c := &rc.Consumers[j]
		cr.cons = append(cr.cons, c.Positions)
		for _, site := range c.Sites {
			pairs = append(pairs, [2]int32{site, int32(j)})
		}
	}
	slices.SortFunc(pairs, func(a, b [2]int32) int { return int(a[0]) - int(b[0]) })
	for _, p := range pairs {
		if n := len(cr.sites); n > 0 && cr.sites[n-1] == p[0] {
			cr.masks[n-1] |= 1 << p[1]
			continue
		}
		cr.sites = append(cr.sites, p[0])
		cr.masks = append(cr.masks, 1<<p[1])
	}
	for _, m := range cr.masks {
		k := slices.Index(cr.distinct, m)
		if k < 0 {
			k = len(cr.distinct)
			cr.distinct = append(cr.distinct, m)
		}
		cr.maskIx = append(cr.maskIx, int32(k))
	}
	cr.group = make([]int32, len(cr.distinct))
	st.cap = cr
	return nil
}

// planCapture plans the step's copies for batch (resolved: s.cur holds its requests): for each
// span of a captured request, the rows its consumers want, grouped per distinct set of
// consumers, and per site the groups copied there. ErrBadBatch for a captured request's decode
// span that starts inside its prompt (a span without its position: Span.Pos).
func (s *Stepper) planCapture(batch []Span) error {
	c := &s.cap
	c.planned = false
	c.groups, c.rows, c.pos, c.pairs = c.groups[:0], c.rows[:0], c.pos[:0], c.pairs[:0]
	for i := range batch {
		sp, cr := &batch[i], s.cur[i].cap
		if cr == nil || sp.Start == sp.End {
			continue
		}
		n := sp.End - sp.Start
		if sp.Phase == PhaseDecode && sp.Pos < cr.promptLen {
			return fmt.Errorf("%w: span %d (%q) is a decode span at position %d, inside its %d-token prompt: give each span the absolute position of its first row (Span.Pos, the request's computed tokens; Python's 5-tuple spans)",
				ErrBadBatch, i, sp.ID, sp.Pos, cr.promptLen)
		}
		for k, m := range cr.distinct {
			sc := c.scratch[:0]
			for mm := m; mm != 0; mm &= mm - 1 {
				sc = cr.cons[bits.TrailingZeros16(mm)].Rows(sc, sp.Pos, n)
			}
			if bits.OnesCount16(m) > 1 {
				slices.Sort(sc)
				sc = slices.Compact(sc)
			}
			c.scratch = sc
			cr.group[k] = -1
			if len(sc) == 0 {
				continue
			}
			g := capGroup{id: sp.ID, off: int32(len(c.rows)), n: int32(len(sc))}
			for _, r := range sc {
				c.rows = append(c.rows, sp.Start+r)
				c.pos = append(c.pos, sp.Pos+r)
			}
			cr.group[k] = int32(len(c.groups))
			c.groups = append(c.groups, g)
		}
		for j, site := range cr.sites {
			if g := cr.group[cr.maskIx[j]]; g >= 0 {
				c.pairs = append(c.pairs, [2]int32{site, g})
			}
		}
	}
	// Per site, its groups in batch order (counting sort).
	clear(c.siteStart)
	for _, p := range c.pairs {
		c.siteStart[p[0]+1]++
	}
	for i := 1; i < len(c.siteStart); i++ {
		c.siteStart[i] += c.siteStart[i-1]
	}
	copy(c.cursor, c.siteStart)
	c.siteGroups = slices.Grow(c.siteGroups[:0], len(c.pairs))[:len(c.pairs)]
	maxN := 0
	for _, p := range c.pairs {
		c.siteGroups[c.cursor[p[0]]] = p[1]
		c.cursor[p[0]]++
		maxN = max(maxN, int(c.groups[p[1]].n))
	}
	for len(c.iota) < maxN {
		c.iota = append(c.iota, len(c.iota))
	}
	c.planned = true
	return nil
}

// captureSite copies site's planned rows of src (the site's block, rows of Hidden elements of
// dt; staged: src holds exactly the site's planned rows in plan order) into the sink, once per
// step and site.
func (s *Stepper) captureSite(hook HookID, layer int, src []byte, dt CaptureDtype, staged bool) {
	c := &s.cap
	site := int(hook)*s.layers + layer
	if !c.planned || c.done[site] == s.step {
		return
	}
	c.done[site] = s.step
	gs := c.siteGroups[c.siteStart[site]:c.siteStart[site+1]]
	if len(gs) == 0 {
		return
	}
	rec := &c.rec
	rec.Layer, rec.Hook, rec.Dtype, rec.Width = layer, s.e.cfg.HookName(hook), dt, s.d
	rowBytes := s.d * dt.Size()
	off := 0
	for _, gi := range gs {
		g := &c.groups[gi]
		rec.RequestID = g.id
		rec.Positions = c.pos[g.off : g.off+g.n]
		if staged {
			rec.Rows = c.iota[:g.n]
			rec.Src = src[off*rowBytes : (off+int(g.n))*rowBytes]
			off += int(g.n)
		} else {
			rec.Rows = c.rows[g.off : g.off+g.n]
			rec.Src = src
		}
		if err := c.sink.Capture(rec); err != nil {
			s.stats.CaptureErrors++
			c.lastErr = err
			continue
		}
		s.stats.CaptureRecords++
		s.stats.CaptureBytes += uint64(int(g.n) * rowBytes)
	}
	if c.flusher != nil {
		c.flusher.Flush()
	}
	*rec = CaptureRecord{}
}

// siteRows is the number of rows planned at site this step.
func (c *capStep) siteRows(site int) int {
	if !c.planned {
		return 0
	}
	n := 0
	for _, gi := range c.siteGroups[c.siteStart[site]:c.siteStart[site+1]] {
		n += int(c.groups[gi].n)
	}
	return n
}

// Capture copies the rows admitted requests capture at (hook, layer) from src, the site's
// T×Hidden block of dtype dt as raw little-endian bytes (bfloat16 and float16 as their 16 bits),
// into the sink SetCapture gave, once per step and site: for a worker whose hidden state is not
// float32 (Apply captures the float32 blocks it steers itself, and a site captured here is not
// captured again by Apply in the same step). It does nothing unless the step captures; every
// argument is checked first (as Apply's: ErrNoStep, ErrUnknownHook, ErrLayerRange, ErrShape,
// ErrBadBatch). Call it before steering the block: captures see the unsteered residual.
func (s *Stepper) Capture(hook HookID, layer int, src []byte, dt CaptureDtype, batch []Span) error {
	if !s.open {
		return ErrNoStep
	}
	size := dt.Size()
	if size == 0 {
		return fmt.Errorf("%w: capture dtype %d, want CaptureF32, CaptureBF16 or CaptureF16", ErrShape, dt)
	}
	if err := s.checkSite(hook, layer); err != nil {
		return err
	}
	rb := s.d * size
	if len(src)%rb != 0 {
		return fmt.Errorf("%w: %d bytes is not a multiple of a %s row (%d bytes)", ErrShape, len(src), dt, rb)
	}
	rows := len(src) / rb
	if !s.sameBatch(batch, rows) {
		if err := s.resolve(batch, rows); err != nil {
			return err
		}
	}
	if s.cap.on {
		s.captureSite(hook, layer, src, dt, false)
	}
	return nil
}

func (s *Stepper) checkSite(hook HookID, layer int) error {
	if int(hook) >= s.e.cfg.NumHooks() {
		return fmt.Errorf("%w: hook id %d", ErrUnknownHook, hook)
	}
	if layer < 0 || layer >= s.layers {
		return fmt.Errorf("%w: layer %d, model has %d", ErrLayerRange, layer, s.layers)
	}
	return nil
}

// planBatchCapture fills the Batch's capture plan from the step's (sites the worker applies
// only, when SetSites restricted them).
func (b *Batch) planBatchCapture() {
	c := &b.s.cap
	b.CaptureSites, b.CaptureStart, b.CaptureRows = b.CaptureSites[:0], b.CaptureStart[:0], b.CaptureRows[:0]
	if !c.on || !c.planned || len(c.groups) == 0 {
		return
	}
	for site := range c.nsites {
		gs := c.siteGroups[c.siteStart[site]:c.siteStart[site+1]]
		if len(gs) == 0 || b.mask != nil && !b.mask[site] {
			continue
		}
		b.CaptureSites = append(b.CaptureSites, int32(site))
		b.CaptureStart = append(b.CaptureStart, int32(len(b.CaptureRows)))
		for _, gi := range gs {
			g := &c.groups[gi]
			for _, r := range c.rows[g.off : g.off+g.n] {
				b.CaptureRows = append(b.CaptureRows, int32(r))
			}
		}
	}
	b.CaptureStart = append(b.CaptureStart, int32(len(b.CaptureRows)))
}

// Capture hands the Batch back one capture site's rows, gathered by the worker: data holds
// the rows CaptureRows lists for site (CaptureSites[i]), in that order, as raw little-endian
// elements of dt, copied from the site's hidden state before its steering add (on a GPU: one
// device-to-host copy per site into pinned memory). The rows go to the Stepper's sink, one
// record per request, once per step and site. Valid from Resolve until the next Resolve (the
// step may have ended). ErrShape for a data length other than the planned rows' or a bad
// dtype, ErrLayerRange for a site out of range; a site with no planned rows (or a Stepper
// that does not capture) takes no data.
func (b *Batch) Capture(site int32, dt CaptureDtype, data []byte) error {
	s := b.s
	c := &s.cap
	if site < 0 || int(site) >= b.nsites {
		return fmt.Errorf("%w: site %d, the model has %d (hooks × layers)", ErrLayerRange, site, b.nsites)
	}
	if dt.Size() == 0 {
		return fmt.Errorf("%w: capture dtype %d, want CaptureF32, CaptureBF16 or CaptureF16", ErrShape, dt)
	}
	n := 0
	if c.on && (b.mask == nil || b.mask[site]) {
		n = c.siteRows(int(site))
	}
	if want := n * s.d * dt.Size(); len(data) != want {
		return fmt.Errorf("%w: %d bytes for site %d, its %d planned rows of %s are %d", ErrShape, len(data), site, n, dt, want)
	}
	if n == 0 {
		return nil
	}
	s.captureSite(HookID(int(site)/s.layers), int(site)%s.layers, data, dt, true)
	return nil
}
