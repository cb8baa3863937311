package steer

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math/bits"

	"github.com/shmsteer/shmsteer/kernels"
	"github.com/shmsteer/shmsteer/shm"
)

// Span is one request's rows in a hidden-state block: rows [Start, End) belong to request ID,
// in phase Phase (PhasePrefill or PhaseDecode). Spans of one batch must not overlap
// (ErrBadBatch); empty spans hold no rows.
type Span struct {
	ID         string
	Start, End int
	Phase      Phase
	// Pos is the absolute token position of row Start (the request's tokens computed before
	// this step: vLLM's num_computed_tokens); row Start+i is position Pos+i. Capture's
	// position selectors read it (a captured request's decode span must lie past its prompt);
	// steering does not. 0..2³¹-1 minus the span's rows.
	Pos int
}

// StepStats counts a Stepper's work.
type StepStats struct {
	Steps   uint64 // Begin calls
	Applies uint64 // Apply calls
	// Recomposes counts compositions (the owner's, read in place) whose entry changed since
	// this Stepper last read them, so it re-validated their layout. Nothing is composed here.
	Recomposes uint64
	// MissingRefs counts references to named vectors that were not registered when the owner
	// composed a set this Stepper read.
	MissingRefs uint64
	// UnknownRequests counts, once per step per request id, spans naming a request with no
	// admitted entry (never admitted, already ended, or a mistyped id): their rows get only the
	// global steering (or ErrUnknownRequest with Options.StrictRequests).
	UnknownRequests uint64
	// GateEvaluations counts probe reads (one per request per probe gate per step) and
	// GateFires the probe gates that fired (this_token: per row); see gates_step.go.
	GateEvaluations, GateFires uint64
	// GateScopes splits them per scope (indexed by GateScope) and counts engagements: a
	// next_step pulse set, a rest_of_ gate becoming engaged (this_token gates have none).
	GateScopes [4]GateStats
	// GateReportsMissed counts device-path steps whose probe scores were never reported
	// (Batch.Report): their probe gates were taken as not fired.
	GateReportsMissed uint64
	// CaptureRecords and CaptureBytes count the records (one per site and request per step)
	// and row bytes the hooks handed to the capture sink; CaptureErrors the records it refused
	// (dropped for a lagging consumer, say: see Stepper.CaptureErr).
	CaptureRecords, CaptureBytes, CaptureErrors uint64
	// ColumnRuns counts runs of two or more one-row spans whose vectors are adjacent cells of
	// the column pool, each added in one pass (colRun), and RunRows the rows they covered.
	ColumnRuns, RunRows uint64
}

// GateStats counts one scope's gates.
type GateStats struct {
	Evaluations, Fires, Engaged uint64
}

// Stepper applies steering to hidden states, one step at a time: Begin pins a snapshot, Apply
// runs for each (hook, layer), End unpins. It reads the owner's compositions in place (see
// composed.go): it keeps no copy of any vector, only a small parsed view per request. It is
// used by one goroutine at a time; make one per goroutine.
type Stepper struct {
	e      *Engine
	strict bool // SetStrictRequests
	d      int
	layers int
	hooks  int // the model's hooks (ModelConfig.NumHooks, kept: Apply checks it every call)

	snap  shm.Snapshot
	open  bool
	step  uint64
	sum   uint64
	gsum  uint64 // gate decisions (GateChecksum)
	stats StepStats

	global composedView
	reqs   map[string]*reqState
	free   []*reqState
	// The batch of the previous Apply of this step and its resolved requests: the same layout
	// is applied at every (hook, layer) of a step, so later Applies only compare it.
	last []Span
	cur  []*reqState
	// resolved: last, cur and steered are a batch resolved in this step (a refused batch leaves
	// them partly filled).
	resolved bool
	// steered lists the spans of that batch that anything steers (a request composition, or
	// the global one for non-empty spans), with what the program needs of them: unsteered
	// requests cost nothing per site. lastEnd is the largest End of the batch's spans.
	steered []steeredSpan
	lastEnd int
	// prog is the steered spans' operations per site, kept from step to step while the spans
	// and their compositions keep their versions (program.go).
	prog program
	// bound: Bind bound the batch in s.last for ApplyBound, a block of boundRows rows.
	bound     bool
	boundRows int
	// pair is scratch for a request's and the global vector summed for a span
	// (kernels.SumAddRows: a row and kernels.ScratchPad).
	pair []float32
	// wide is ApplyBF16's float32 copy of a block's spanned rows.
	wide []float32
	// runs: the region's column pool fits the model with cells of exactly Hidden floats, so a
	// run of adjacent cells is one block of rows (addRun).
	runs bool
	// gated lists the gate states of the requests decoded in this step (advanced at End).
	gated []*gateState
	// convEngaged remembers the rest_of_conversation gates that engaged, per conversation.
	convEngaged map[uint64]bool
	convOrder   []uint64
	// devGates is the gate state of the Batch whose device-path step awaits its gate scores
	// (batch_gates.go); a native Apply in that step takes its gates over.
	devGates *batchGates
	// cap is the step's capture (capture_step.go).
	cap capStep
}

type reqState struct {
	view   composedView
	id     string
	idHash uint64
	seen   uint64 // step it was last resolved in (0: re-read at the next)
	at     uint64 // region version it was last resolved at
	known  bool   // it has an entry at the step's version
	gates  *gateState
	cap    *capReq // its capture entry, read while the Stepper captures
}

// NewStepper makes a Stepper for this engine's region.
func (e *Engine) NewStepper() *Stepper {
	c := e.cfg
	_, _, cellBytes := e.pool.Geometry()
	return &Stepper{e: e, d: c.Hidden, layers: c.Layers, hooks: c.NumHooks(), reqs: map[string]*reqState{}, pair: make([]float32, c.Hidden+kernels.ScratchPad),
		runs: e.poolFits && cellBytes == 4*c.Hidden, prog: program{sites: make([]siteProg, c.NumHooks()*c.Layers)}}
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
	s.sum, s.gsum = 0, 0
	s.last = s.last[:0]
	s.bound, s.resolved = false, false
	s.beginCapture()
	if s.step%64 == 0 {
		s.evictIdle()
	}
	if err := s.readGlobal(); err != nil {
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

// End finishes the step, unpins its snapshot and returns its checksum. Views read during the
// step must not be used afterwards.
func (s *Stepper) End() uint64 { return s.end(false) }

// PinWords are the open step's snapshot's words (shm.Snapshot.PinWords: its pin word, holding
// Version, and the region's version and horizon), for the C ABI, which ends a native step
// outside Go when EndReleases holds (capi's plan.c): it stores zero in the pin word and the
// next call into Go ends the step with EndReleased. Nil outside a step.
func (s *Stepper) PinWords() (pin, version, horizon *uint64) {
	if !s.open {
		return nil, nil, nil
	}
	return s.snap.PinWords()
}

// EndReleases reports whether ending the open step would only release its snapshot and return
// the checksum: no gated request decoded in it, no capture, no device-path gate report awaited.
func (s *Stepper) EndReleases() bool {
	return s.open && len(s.gated) == 0 && !s.cap.on && (s.devGates == nil || !s.devGates.awaiting)
}

// EndReleased is End for a step whose pin the caller already released through PinWords: the
// snapshot is forgotten, not unpinned.
func (s *Stepper) EndReleased() uint64 { return s.end(true) }

func (s *Stepper) end(released bool) uint64 {
	if s.open {
		s.advanceGates()
		if released {
			s.snap.Forget()
		} else {
			s.snap.Close()
		}
		s.open = false
		s.last = s.last[:0]
		s.bound, s.resolved = false, false
	}
	return s.sum
}

// Stats returns the counters.
func (s *Stepper) Stats() StepStats { return s.stats }

// Hidden is the model's hidden size: the row length of the blocks Apply takes.
func (s *Stepper) Hidden() int { return s.d }

// SetStrictRequests makes this Stepper's Apply (and a Batch's Resolve on it) fail with
// ErrUnknownRequest when a span names a request with no admitted entry, as
// Options.StrictRequests does for every Stepper of the engine; off, such rows get the global
// steering only and are counted (StepStats.UnknownRequests). Call it between steps.
func (s *Stepper) SetStrictRequests(on bool) { s.strict = on }

// Close ends any open step and drops the caches.
func (s *Stepper) Close() {
	s.End()
	s.reqs, s.free, s.cur = map[string]*reqState{}, nil, nil
	s.prog.valid, s.prog.key = false, nil
}

// Apply adds the effective steering (global base + global phase + request base + request
// phase) of each span's request to its rows of h, a T×Hidden row-major block for (hook,
// layer), then applies the clamps there (global ones first), in place. Rows outside every span
// are untouched. It allocates nothing once its program is built. Every argument is checked
// before h is modified; the batch is validated and its requests resolved once per step, and
// later Applies with the same layout only compare it; then the site's program runs
// (program.go), built once per layout and kept from step to step while the compositions it
// read keep their versions. A caller passing the same batch at every site may bind it once
// instead (Bind, ApplyBound: the same program, no comparison per site).
func (s *Stepper) Apply(hook HookID, layer int, h []float32, batch []Span) error {
	if !s.open {
		return ErrNoStep
	}
	if err := s.checkApply(hook, layer); err != nil {
		return err
	}
	d := s.d
	if len(h)%d != 0 {
		return fmt.Errorf("%w: %d floats is not a multiple of hidden size %d", ErrShape, len(h), d)
	}
	rows := len(h) / d
	if !s.sameBatch(batch, rows) {
		if err := s.resolve(batch, rows); err != nil {
			return err
		}
	}
	s.exec(hook, layer, h)
	return nil
}

// checkApply checks an apply's site, and takes over the gates of a device-path step that
// awaits its scores: a native apply in it gates its rows itself.
func (s *Stepper) checkApply(hook HookID, layer int) error {
	if s.devGates != nil && s.devGates.awaiting {
		s.devGates.cancel()
	}
	if int(hook) >= s.hooks {
		return fmt.Errorf("%w: hook id %d", ErrUnknownHook, hook)
	}
	if layer < 0 || layer >= s.layers {
		return fmt.Errorf("%w: layer %d, model has %d", ErrLayerRange, layer, s.layers)
	}
	return nil
}

// siteAhead is how many spans ahead a site's build asks for a request's site entry.
const siteAhead = 4

// steeredSpan is one steered span of the resolved batch, as the program reads it: its rows,
// its request, the site-entry offset of its phase (0 prefill, 1 decode), whether it is
// gated, and its fixed checksum words already multiplied by mix64's first constant.
type steeredSpan struct {
	st                       *reqState
	start, end, ph           int
	gated                    bool
	idMul, rowsMul, phaseMul uint64
}

// sameBatch reports whether batch is the layout the previous Apply of this step resolved
// (rows is the block's row count; every span must fit it). A caller passing the same spans
// again, the usual case, passes the same bytes: the strings' pointers and lengths too, and a
// string's bytes never change, so one comparison of the spans' bytes with the resolved copy
// answers (spansEqual). Anything else (a span changed in place, equal ids in other strings,
// different padding) is compared field by field; if that finds the same layout, the copy is
// refreshed so the next Apply compares bytes again.
func (s *Stepper) sameBatch(batch []Span, rows int) bool {
	if !s.resolved || len(batch) != len(s.last) || len(s.cur) != len(batch) || rows < s.lastEnd {
		return false
	}
	if spansEqual(batch, s.last) {
		return true
	}
	last := s.last[:len(batch)]
	for i := range batch {
		a, b := &batch[i], &last[i]
		if a.Start != b.Start || a.End != b.End || a.Phase != b.Phase || a.Pos != b.Pos || a.ID != b.ID {
			return false
		}
	}
	copy(s.last, batch)
	return true
}

// resolve validates every span and finds each request's composition at the step's version.
func (s *Stepper) resolve(batch []Span, rows int) error {
	s.bound, s.resolved = false, false
	s.last = s.last[:0]
	s.cur = s.cur[:0]
	s.steered = s.steered[:0]
	maxEnd, lastEnd := 0, 0
	for i := range batch {
		sp := &batch[i]
		if sp.Phase != PhasePrefill && sp.Phase != PhaseDecode {
			return fmt.Errorf("%w: span %d (%q) has phase %d (%s): set Span.Phase to PhasePrefill (1) or PhaseDecode (2)", ErrBadBatch, i, sp.ID, uint8(sp.Phase), sp.Phase)
		}
		if sp.ID == "" || len(sp.ID) > MaxIDLen || sp.Start < 0 || sp.Start > sp.End || sp.End > rows {
			return fmt.Errorf("%w: span %d (%q rows [%d, %d)) in a block of %d rows", ErrBadBatch, i, sp.ID, sp.Start, sp.End, rows)
		}
		if sp.Pos < 0 || sp.Pos > MaxPromptLen-(sp.End-sp.Start) {
			return fmt.Errorf("%w: span %d (%q) has first position %d; positions are 0..%d", ErrBadBatch, i, sp.ID, sp.Pos, MaxPromptLen)
		}
		if j := overlaps(batch, i, maxEnd); j >= 0 {
			s.cur = s.cur[:0]
			q := &batch[j]
			return fmt.Errorf("%w: span %d (%q rows [%d, %d)) overlaps span %d (%q rows [%d, %d)): each row belongs to one request", ErrBadBatch, i, sp.ID, sp.Start, sp.End, j, q.ID, q.Start, q.End)
		}
		if sp.Start < sp.End {
			maxEnd = max(maxEnd, sp.End)
		}
		lastEnd = max(lastEnd, sp.End)
		st, err := s.request(sp.ID)
		if err != nil {
			s.cur = s.cur[:0]
			return err
		}
		s.cur = append(s.cur, st)
		if sp.Start < sp.End && (st.view.sites != 0 || s.global.sites != 0 || st.gates != nil) {
			s.steered = append(s.steered, steeredSpan{
				st: st, start: sp.Start, end: sp.End, ph: int(sp.Phase) - 1,
				gated:   st.gates != nil && sp.Phase == PhaseDecode,
				idMul:   st.idHash * mixK1,
				rowsMul: (uint64(sp.Start)<<32 | uint64(sp.End)) * mixK1, phaseMul: uint64(sp.Phase) * mixK1,
			})
		}
	}
	if s.cap.on {
		if err := s.planCapture(batch); err != nil {
			s.cur = s.cur[:0]
			return err
		}
	}
	s.last = append(s.last, batch...)
	s.lastEnd = lastEnd
	s.resolved = true
	s.reuseProgram()
	return nil
}

// overlaps reports the earlier span whose rows span i's overlap, or -1. maxEnd is the largest
// End among the earlier non-empty spans: a span starting at or after it overlaps none (one
// comparison per span in row order, the usual layout); one starting before it is checked
// against each earlier span. Empty spans hold no rows and overlap nothing.
func overlaps(batch []Span, i, maxEnd int) int {
	sp := &batch[i]
	if sp.Start == sp.End || sp.Start >= maxEnd {
		return -1
	}
	for j := range i {
		if q := &batch[j]; q.Start < q.End && q.Start < sp.End && sp.Start < q.End {
			return j
		}
	}
	return -1
}

// request returns request id's composition at this step's version, reading its entry once per
// step and re-validating its layout only when its version changed.
func (s *Stepper) request(id string) (*reqState, error) {
	st := s.reqs[id]
	if st == nil {
		if n := len(s.free); n > 0 {
			st, s.free = s.free[n-1], s.free[:n-1]
		} else {
			st = &reqState{}
		}
		*st = reqState{id: id}
		h := fnv.New64a()
		h.Write([]byte(id))
		st.idHash = h.Sum64()
		s.reqs[st.id] = st
	}
	if st.seen == s.step {
		return st, nil
	}
	if st.known && st.seen != 0 && st.at == s.snap.Version() {
		// The region is at the version this request was last read at: its composition,
		// capture and gate entries are the same bytes at the same places, kept by this
		// step's pin, so the step skips their lookups (two per request: ~4% of a prefill
		// step).
		st.seen = s.step
		return st, nil
	}
	_, ver, err := s.snap.View(KindComposed, id)
	switch {
	case errors.Is(err, shm.ErrNotFound):
		s.stats.UnknownRequests++
		if s.e.opt.StrictRequests || s.strict {
			return nil, fmt.Errorf("%w: %q has no entry at version %d (call Owner.Admit for every request in a batch, and End only after its last step)", ErrUnknownRequest, id, s.snap.Version())
		}
		st.view, st.known = composedView{}, false
	case err != nil:
		return nil, fmt.Errorf("request %q: %w", id, err)
	case !st.known || ver != st.view.version:
		v, err := openComposed(&s.snap, s.e.cfg, s.e.pool, KindComposed, id, KindRequest)
		if err != nil {
			return nil, fmt.Errorf("request %q: %w", id, err)
		}
		s.stats.Recomposes++
		s.stats.MissingRefs += uint64(v.missing)
		st.view, st.known = v, true
	default:
		// Same version: the same bytes at the same place, and the same in-place terms (any
		// change of what they read rewrites this entry), all kept by this step's pin.
	}
	if err := s.readCapture(st); err != nil {
		return nil, err
	}
	if err := s.readGates(st); err != nil {
		return nil, err
	}
	st.seen, st.at = s.step, s.snap.Version()
	return st, nil
}

// readGlobal reads the global composition at the step's version.
func (s *Stepper) readGlobal() error {
	_, ver, err := s.snap.View(KindComposedGlobal, globalKey)
	switch {
	case errors.Is(err, shm.ErrNotFound):
		s.global = composedView{}
		return nil
	case err != nil:
		return fmt.Errorf("global steering: %w", err)
	case ver == s.global.version && ver != 0:
		return nil
	}
	v, err := openComposed(&s.snap, s.e.cfg, s.e.pool, KindComposedGlobal, globalKey, KindGlobal)
	if err != nil {
		return fmt.Errorf("global steering: %w", err)
	}
	s.stats.Recomposes++
	s.stats.MissingRefs += uint64(v.missing)
	s.global = v
	return nil
}

// evictIdle recycles the state of requests not seen in the last 64 steps (they ended).
func (s *Stepper) evictIdle() {
	for id, st := range s.reqs {
		if s.step-st.seen > 64 {
			delete(s.reqs, id)
			*st = reqState{}
			s.free = append(s.free, st)
		}
	}
}

func digest64(d Digest) uint64 { return le.Uint64(d[:8]) }

// mix64 folds x into h (order-dependent), with the multiply-rotate rounds of xxhash.
func mix64(h, x uint64) uint64 { return mixPre(h, x*mixK1) }

// mixPre is mix64(h, x) given xm = x*mixK1.
func mixPre(h, xm uint64) uint64 {
	h ^= xm
	return bits.RotateLeft64(h, 31) * mixK2
}

// mix64's constants.
const mixK1, mixK2 = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F
