package main

// The Go side of plan.c: a stepper's plain sites handed to C, and C's applies replayed.

/*
#include <stdint.h>
#include "plan.h"
*/
import "C"

import (
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
}

// settle replays the sites C applied since Go last saw this stepper, in the order they ran,
// and closes the plan unless keep: called before anything reads or changes the stepper.
func (st *stepper) settle(keep bool) C.int {
	p := st.plan
	if p == nil {
		return C.SHMSTEER_OK
	}
	if !keep {
		C.capi_plan_close(p)
	}
	var sites *C.uint32_t
	n := C.capi_plan_trail(p, &sites)
	var err error
	for _, site := range unsafe.Slice((*uint32)(unsafe.Pointer(sites)), int(n)) {
		if err = st.st.Replay(steer.HookID(int(site)/st.layers), int(site)%st.layers); err != nil {
			C.capi_plan_close(p)
			break
		}
	}
	if C.capi_plan_take_ended(p) != 0 {
		st.st.EndReleased() // C ended the step and released its pin (capi_plan_end)
	}
	if err != nil {
		return fail(err)
	}
	return C.SHMSTEER_OK
}

// planPin lets C end the native step a resolve just opened (capi_plan_end): the plan gets its
// pin word.
func (st *stepper) planPin() {
	if p := st.plan; p != nil {
		if w := st.st.PinWord(); w != nil {
			C.capi_plan_set_pin(p, (*C.uint64_t)(unsafe.Pointer(w)), C.uint64_t(st.st.Version()))
		}
	}
}

// planEnd is Go's end of the stepper's step: when every apply of a native step ran in C and
// ending it only releases its pin, the plan keeps its sites and checksum, so that the next
// steps of the same program whose applies are the same end in C (capi_plan_end).
func (st *stepper) planEnd() (uint64, C.int) {
	p := st.plan
	armed := p != nil && st.st.EndReleases() && C.capi_plan_arm_end(p) != 0
	if rc := st.settle(false); rc != C.SHMSTEER_OK {
		return 0, rc
	}
	sum := st.st.End()
	if armed {
		C.capi_plan_end_sum(p, C.uint64_t(sum))
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
