package main

// The Go side of plan.c: a stepper's plain sites handed to C, and C's applies replayed.

/*
// C keeps none of the Go pointers these are handed (out-parameters on Go's stack) and calls
// no Go: no heap allocation and no callback bookkeeping on every resolve's settle.
#cgo noescape capi_plan_settle
#cgo nocallback capi_plan_settle
#cgo noescape capi_plan_step
#cgo nocallback capi_plan_step
#cgo noescape capi_plan_end_order
#cgo nocallback capi_plan_end_order
#cgo noescape capi_plan_expect_end
#cgo nocallback capi_plan_expect_end
#include <stdint.h>
#include "plan.h"
*/
import "C"

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/shmsteer/shmsteer/steer"
)

// The kinds of an add, as plan.h numbers them.
const (
	_ = uint(C.CAPI_ADD_EACH - C.int(steer.PlainEach))
	_ = uint(C.int(steer.PlainEach) - C.CAPI_ADD_EACH)
	_ = uint(C.CAPI_ADD_BLOCK - C.int(steer.PlainBlock))
	_ = uint(C.int(steer.PlainBlock) - C.CAPI_ADD_BLOCK)
	_ = uint(C.CAPI_ADD_PAIR - C.int(steer.PlainPair))
	_ = uint(C.int(steer.PlainPair) - C.CAPI_ADD_PAIR)
)

// planRegister gives stepper handle h its C plan (nil when C is out of memory: every apply
// then goes to Go).
func (st *stepper) planRegister(h uint64) {
	cfg := st.inst.eng.Config()
	st.layers = cfg.Layers
	st.plan = C.capi_plan_register(C.uint64_t(h), C.int32_t(cfg.Hidden), C.int32_t(cfg.Layers), C.int32_t(cfg.NumHooks()*cfg.Layers))
	st.inst.trackPlan(st.plan)
}

// settle brings Go up to what C did with this stepper since Go last saw it, in order, and
// closes the plan unless keep: called before anything reads or changes the stepper. The trail
// holds the applies C made in the step Go began (or in a step C began after it: from cbase
// on); then come the end C made of Go's step (EndReleased), the steps C began and ended
// (Batch.CountSteps), and a step C began that is still open, which Go takes over (adopt).
func (st *stepper) settle(keep bool) C.int {
	p := st.plan
	if p == nil {
		return C.SHMSTEER_OK
	}
	var k C.int
	if keep {
		k = 1
	}
	s := C.capi_plan_settle(p, k) // one crossing: the plan's answer is in C memory
	cbase := uint32(s.cbase)      // MaxUint32: no step C began is open
	trail := unsafe.Slice((*uint32)(unsafe.Pointer(s.trail)), int(s.ntrail))
	mine, open := trail, []uint32(nil)
	if cbase != math.MaxUint32 {
		mine, open = trail[:cbase], trail[cbase:]
	}
	err := st.replay(mine)
	if s.ended != 0 {
		st.st.EndReleased() // C ended the step and released its pin (capi_plan_end)
	}
	if k := uint64(s.csteps); k > 0 {
		if b := st.planBatch(); b != nil {
			if e := b.b.CountSteps(k, unsafe.Slice((*uint32)(unsafe.Pointer(s.csites)), int(s.ncsites))); err == nil {
				err = e
			}
		}
	}
	if k := uint64(s.dsteps); k > 0 {
		if b, ok := getAs[*batch](uint64(s.dbatch)); ok {
			if e := b.b.CountSteps(k, nil); err == nil {
				err = e
			}
		}
	}
	if cbase != math.MaxUint32 {
		if e := st.adopt(); e != nil {
			if err == nil {
				err = e
			}
		} else if e := st.replay(open); err == nil {
			err = e
		}
	}
	if err != nil {
		C.capi_plan_close(p)
		st.planDisarm()
		return fail(err)
	}
	return C.SHMSTEER_OK
}

// replay records the applies C made of sites, in order (steer's Replay).
func (st *stepper) replay(sites []uint32) error {
	for _, site := range sites {
		if err := st.st.Replay(steer.HookID(int(site)/st.layers), int(site)%st.layers); err != nil {
			return err
		}
	}
	return nil
}

// planStep is the step C began or armed: its spans (ids in the plan's copy), its batch's
// handle, rows and version.
func (st *stepper) planStep() (spans []C.shmsteer_span, ids *C.char, bh C.uint64_t, rows C.int64_t, ver C.uint64_t) {
	var n C.size_t
	cs := C.capi_plan_step(st.plan, &n, &ids, &bh, &rows, &ver)
	return unsafe.Slice(cs, int(n)), ids, bh, rows, ver
}

// planBatch is the batch the plan's armed resolve belongs to (nil: none, or freed).
func (st *stepper) planBatch() *batch {
	_, _, bh, _, _ := st.planStep()
	b, ok := getAs[*batch](uint64(bh))
	if !ok {
		return nil
	}
	return b
}

// adopt takes over the step C began (capi_plan_resolve): Go resolves the same spans at the
// same version (its own pin taken before C's is released, so the version is never unpinned),
// which gives the checksum C gave.
func (st *stepper) adopt() error {
	defer C.capi_plan_adopted(st.plan)
	cs, ids, bh, rows, ver := st.planStep()
	b, ok := getAs[*batch](uint64(bh))
	if !ok {
		return fmt.Errorf("%w: the batch of a step begun in C was freed", steer.ErrBadBatch)
	}
	total := 0
	for i := range cs {
		total += int(cs[i].id_len)
	}
	var idb []byte // the ids' bytes, as the plan copied them (the caller's may be gone)
	if total > 0 {
		idb = unsafe.Slice((*byte)(unsafe.Pointer(ids)), total)
	}
	b.spans = b.spans[:0]
	for i, o := 0, 0; i < len(cs); i++ {
		c := &cs[i]
		l := int(c.id_len)
		b.spans = append(b.spans, steer.Span{ID: st.intern(idb[o : o+l]), Start: int(c.start), End: int(c.end), Phase: steer.Phase(c.phase), Pos: int(c.first_position)})
		o += l
	}
	if err := b.b.ResolveNative(uint64(ver), b.spans, int(rows)); err != nil {
		return err
	}
	b.pin.Unpin()
	return nil
}

// planArm lets C begin the next steps of batch h while they are this one advanced (the same
// spans but for their first positions, rows rows) at the same version (capi_plan_resolve): the
// step's version and checksum, and the words to pin its snapshot's slot with. Only for a step
// whose end only releases its pin (no gate, no capture).
func (st *stepper) planArm(h C.uint64_t, rows int, version, sum uint64) {
	p := st.plan
	if p == nil || !st.st.EndReleases() {
		return
	}
	_, vw, hw := st.st.PinWords()
	if vw == nil {
		return
	}
	C.capi_plan_arm_resolve(p, h, C.int64_t(rows), C.uint64_t(version), C.uint64_t(sum), (*C.uint64_t)(unsafe.Pointer(vw)), (*C.uint64_t)(unsafe.Pointer(hw)))
}

// planDisarm stops C beginning this stepper's steps until a native resolve arms it again.
func (st *stepper) planDisarm() {
	if p := st.plan; p != nil {
		C.capi_plan_disarm(p, 0)
	}
}

// planPin lets C end the native step a resolve just opened (capi_plan_end): the plan gets its
// pin word.
func (st *stepper) planPin() {
	if p := st.plan; p != nil {
		if w, _, _ := st.st.PinWords(); w != nil {
			C.capi_plan_set_pin(p, (*C.uint64_t)(unsafe.Pointer(w)), C.uint64_t(st.st.Version()))
		}
	}
}

// planExpectEnd arms C's end of the native step a resolve just opened (capi_plan_expect_end),
// before its applies: for the sites in the order of the last end C could make (else sites, the
// batch's, in order), with the checksum Go's end would give after they ran (steer's PlainSum).
// The first step of a new batch (a new program generation) then ends in C when its sites run
// in that order; in any other, Go ends it as before and arms the order it saw.
func (st *stepper) planExpectEnd(sites []int32) {
	p := st.plan
	if p == nil || C.capi_plan_is_open(p) == 0 || !st.st.EndReleases() {
		return
	}
	var cs *C.uint32_t
	n := C.capi_plan_end_order(p, &cs)
	if n == math.MaxUint32 {
		return // armed for this generation by an end Go made
	}
	if n > 0 {
		st.order = append(st.order[:0], unsafe.Slice((*uint32)(unsafe.Pointer(cs)), int(n))...)
		if st.expectEnd() {
			return
		}
	}
	st.order = st.order[:0]
	for _, s := range sites {
		st.order = append(st.order, uint32(s))
	}
	st.expectEnd()
}

// expectEnd arms C's end for the sites in st.order when they are all plain in the step.
func (st *stepper) expectEnd() bool {
	if len(st.order) == 0 {
		return false
	}
	sum, ok := st.st.PlainSum(st.order)
	if ok {
		C.capi_plan_expect_end(st.plan, (*C.uint32_t)(unsafe.Pointer(&st.order[0])), C.uint32_t(len(st.order)), C.uint64_t(sum))
	}
	return ok
}

// planEnd is Go's end of the stepper's step: when every apply of a native step ran in C and
// ending it only releases its pin, the plan keeps its sites and checksum, so that the next
// steps of the same program whose applies are the same end in C (capi_plan_end).
func (st *stepper) planEnd() (uint64, C.int) {
	p := st.plan
	armed := p != nil && C.capi_plan_arm_end(p) != 0 // the trail, before settle replays it
	resolved := p != nil && C.capi_plan_res_ok(p) != 0
	if rc := st.settle(false); rc != C.SHMSTEER_OK {
		return 0, rc
	}
	releases := st.st.EndReleases() // a step C began is Go's only now
	sum := st.st.End()
	if armed && releases {
		C.capi_plan_end_sum(p, C.uint64_t(sum))
	}
	if resolved && releases {
		// Nothing but this end since the native resolve that armed C's begin: it holds for
		// the batch's next step.
		C.capi_plan_rearm(p)
	}
	return sum, C.SHMSTEER_OK
}

// planAfterApply runs after a Go apply of (hook, layer) with spans: the plan opens for the
// step's resolved batch (when the step may have plain sites) and takes the site when it is
// plain, so the step's later applies of it, and the next steps' while the program's
// generation holds, run in C. An apply that failed, or of other spans than the plan's, closes
// it.
func (st *stepper) planAfterApply(ok bool, hook C.uint32_t, layer C.int32_t, spans *C.shmsteer_span, nSpans C.size_t) {
	p := st.plan
	if p == nil {
		return
	}
	if !ok || !st.st.PlainStep() {
		C.capi_plan_close(p)
		return
	}
	gen := st.st.Generation()
	if C.capi_plan_is_open(p) == 0 || uint64(C.capi_plan_gen(p)) != gen || C.capi_plan_spans_equal(p, spans, nSpans) == 0 {
		if C.capi_plan_open(p, C.uint64_t(gen), spans, nSpans) == 0 {
			return
		}
	}
	st.planSite(hook, layer)
}

// planOpen opens the plan for a batch a native resolve (Batch.ResolveNative) resolved.
func (st *stepper) planOpen(spans *C.shmsteer_span, nSpans C.size_t) {
	if p := st.plan; p != nil && st.st.PlainStep() {
		C.capi_plan_open(p, C.uint64_t(st.st.Generation()), spans, nSpans)
	}
}

// planExport hands the open plan the plain sites among sites (the batch's SetSites; nil: none)
// once per program generation, so that a native step of a new batch runs its plain sites in C
// from its first apply on: their programs are built here, inside the resolve's one crossing,
// instead of in one crossing into Go per site.
func (st *stepper) planExport(sites []int32) {
	p := st.plan
	if p == nil || len(sites) == 0 || C.capi_plan_is_open(p) == 0 {
		return
	}
	gen := st.st.Generation()
	if st.exported == gen {
		return
	}
	st.exported = gen
	for _, s := range sites {
		st.planSite(C.uint32_t(int(s)/st.layers), C.int32_t(int(s)%st.layers))
	}
}

// planSite hands site (hook, layer) to the open plan when it is plain.
func (st *stepper) planSite(hook C.uint32_t, layer C.int32_t) {
	p := st.plan
	site := C.uint32_t(int(hook)*st.layers + int(layer))
	if C.capi_plan_site_ready(p, site) != 0 {
		return
	}
	var ok bool
	st.adds, ok = st.st.PlainSite(st.adds[:0], steer.HookID(hook), int(layer))
	if !ok {
		return
	}
	n := len(st.adds)
	dst := C.capi_plan_site_reserve(p, C.uint32_t(n))
	if dst == nil {
		return
	}
	out, d := unsafe.Slice(dst, n), st.st.Hidden()
	for i := range st.adds {
		a := &st.adds[i]
		// C reads Hidden floats of V and G per row: a shorter view stays with Go.
		want := d
		if a.Kind == steer.PlainBlock {
			want = (a.End - a.Start) * d
		}
		if len(a.V) < want || (a.Kind == steer.PlainPair && len(a.G) < d) {
			return
		}
		out[i] = C.capi_plan_add{v: (*C.float)(unsafe.Pointer(unsafe.SliceData(a.V))), start: C.int64_t(a.Start), end: C.int64_t(a.End), kind: C.int32_t(a.Kind)}
		if a.Kind == steer.PlainPair {
			out[i].g = (*C.float)(unsafe.Pointer(unsafe.SliceData(a.G)))
		}
	}
	C.capi_plan_site_commit(p, site, C.uint32_t(n))
}
