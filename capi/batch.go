package main

/*
#include <stdint.h>
#include <stdlib.h>
#include "shmsteer.h"
#include "plan.h"
*/
import "C"

import (
	"fmt"
	"math"
	"runtime"
	"unsafe"

	"github.com/shmsteer/shmsteer/steer"
)

// batch is a shmsteer_batch_t: a steer.Batch over a stepper's steps. Resolve's outputs are Go
// slices handed to C in place, kept pinned until the next resolve or free.
type batch struct {
	sth   uint64 // the stepper's handle: looked up at every call, so a freed stepper is refused
	b     *steer.Batch
	spans []steer.Span
	pin   runtime.Pinner
}

//export shmsteerGo_batch_new
func shmsteerGo_batch_new(h C.uint64_t, opt *C.shmsteer_batch_options, out *C.uint64_t) C.int {
	st, rc := stepperOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	if out == nil {
		return badArg("out must not be NULL")
	}
	var o steer.BatchOptions
	if opt != nil {
		if opt.max_slots > steer.MaxBatchSlots || opt.max_clamps > 64 || opt.max_clamps < -1 || opt.max_gate_slots > steer.MaxGates*steer.MaxBatchSlots || opt.max_row_gates > steer.MaxGates || opt.max_row_gates < -1 {
			return badArg(fmt.Sprintf("max_slots %d (at most %d), max_clamps %d (-1..64), max_gate_slots %d (at most %d) or max_row_gates %d (-1..%d)", opt.max_slots, steer.MaxBatchSlots, opt.max_clamps, opt.max_gate_slots, steer.MaxGates*steer.MaxBatchSlots, opt.max_row_gates, steer.MaxGates))
		}
		o = steer.BatchOptions{MaxSlots: int(opt.max_slots), MaxClamps: int(opt.max_clamps), MaxGateSlots: int(opt.max_gate_slots), MaxRowGates: int(opt.max_row_gates)}
	}
	b, err := st.st.NewBatch(o)
	if err != nil {
		return fail(err)
	}
	return store(&batch{sth: uint64(h), b: b}, out)
}

//export shmsteerGo_batch_free
func shmsteerGo_batch_free(h C.uint64_t) C.int {
	b, ok := getAs[*batch](uint64(h))
	if !ok {
		return badHandle("shmsteer_batch_free")
	}
	if st, ok := getAs[*stepper](b.sth); ok {
		st.settle(false) // a step C began on this batch is taken over; C's begin is disarmed
	}
	if !handles.remove(uint64(h)) {
		return badHandle("shmsteer_batch_free")
	}
	b.pin.Unpin()
	return C.SHMSTEER_OK
}

//export shmsteerGo_batch_reset
func shmsteerGo_batch_reset(h C.uint64_t) C.int {
	b, ok := getAs[*batch](uint64(h))
	if !ok {
		return badHandle("not a live shmsteer_batch_t")
	}
	if st, ok := getAs[*stepper](b.sth); ok {
		if rc := st.settle(false); rc != C.SHMSTEER_OK {
			return rc
		}
	}
	b.b.Reset()
	return C.SHMSTEER_OK
}

//export shmsteerGo_batch_sites
func shmsteerGo_batch_sites(h C.uint64_t, sites *C.int32_t, n C.size_t) C.int {
	b, ok := getAs[*batch](uint64(h))
	if !ok {
		return badHandle("not a live shmsteer_batch_t")
	}
	if st, ok := getAs[*stepper](b.sth); ok {
		if rc := st.settle(false); rc != C.SHMSTEER_OK {
			return rc
		}
	}
	if sites == nil && n > 0 || n > 1<<24 {
		return badArg("sites")
	}
	var ss []int32
	if n > 0 {
		ss = append(ss, unsafe.Slice((*int32)(unsafe.Pointer(sites)), int(n))...)
	}
	if err := b.b.SetSites(ss); err != nil {
		return fail(err)
	}
	if st, ok := getAs[*stepper](b.sth); ok {
		st.exported = 0 // new sites: the next native resolve hands them to the plan (settle disarmed C's begin)
	}
	return C.SHMSTEER_OK
}

// goSpans converts C spans to the stepper's reusable slice, interning ids (a negative
// first_position is the stepper's BAD_BATCH).
func goSpans(st *stepper, dst []steer.Span, spans *C.shmsteer_span, nSpans C.size_t) ([]steer.Span, C.int) {
	dst = dst[:0]
	if spans == nil && nSpans > 0 || uint64(nSpans) > math.MaxInt32 {
		return dst, badArg("spans")
	}
	var cs []C.shmsteer_span
	if nSpans > 0 {
		cs = unsafe.Slice(spans, int(nSpans))
	}
	for i := range cs {
		c := &cs[i]
		idb, ok := cbytes(unsafe.Pointer(c.id), c.id_len)
		if !ok || c.start < 0 || c.end < 0 || c.start > math.MaxInt32 || c.end > math.MaxInt32 {
			return dst, badArg(fmt.Sprintf("span %d", i))
		}
		dst = append(dst, steer.Span{ID: st.intern(idb), Start: int(c.start), End: int(c.end), Phase: steer.Phase(c.phase), Pos: int(c.first_position)})
	}
	return dst, C.SHMSTEER_OK
}

// resolveNative is shmsteerGo_batch_resolve with SHMSTEER_BATCH_NATIVE: only the version and
// checksum, no pointer pinned. The step left open, the stepper's plan opens for its batch
// (spans, as C passed them): its plain sites then run in C (plan.go).
func resolveNative(h C.uint64_t, st *stepper, b *batch, version C.uint64_t, rows int, flags C.uint32_t, spans *C.shmsteer_span, nSpans C.size_t, out *C.shmsteer_batch_info) C.int {
	if err := b.b.ResolveNative(uint64(version), b.spans, rows); err != nil {
		return fail(err)
	}
	b.pin.Unpin()
	*out = C.shmsteer_batch_info{}
	out.version, out.checksum = C.uint64_t(b.b.Version), C.uint64_t(b.b.Checksum)
	if flags&C.SHMSTEER_BATCH_END != 0 {
		st.st.End()
	} else {
		st.planOpen(spans, nSpans)
		sites := b.b.AppliedSites()
		st.planExport(sites)
		st.planPin()
		st.planExpectEnd(sites)
		if flags == C.SHMSTEER_BATCH_NATIVE && version == 0 {
			st.planArm(h, rows, b.b.Version, b.b.Checksum)
		}
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_batch_resolve
func shmsteerGo_batch_resolve(h C.uint64_t, version C.uint64_t, spans *C.shmsteer_span, nSpans C.size_t, rows C.int64_t, flags C.uint32_t, out *C.shmsteer_batch_info) C.int {
	b, ok := getAs[*batch](uint64(h))
	if !ok {
		return badHandle("not a live shmsteer_batch_t")
	}
	st, rc := stepperOf(C.uint64_t(b.sth))
	if rc != C.SHMSTEER_OK {
		return badHandle("the batch's stepper was freed")
	}
	if out == nil || rows < 0 || rows > math.MaxInt32 || flags&^(C.SHMSTEER_BATCH_END|C.SHMSTEER_BATCH_RESET|C.SHMSTEER_BATCH_NATIVE) != 0 {
		return badArg("out, rows or flags")
	}
	var rc2 C.int
	b.spans, rc2 = goSpans(st, b.spans, spans, nSpans)
	if rc2 != C.SHMSTEER_OK {
		return rc2
	}
	if flags&C.SHMSTEER_BATCH_RESET != 0 {
		b.b.Reset()
	}
	if flags&C.SHMSTEER_BATCH_NATIVE != 0 {
		return resolveNative(h, st, b, version, int(rows), flags, spans, nSpans, out)
	}
	err := b.b.Resolve(uint64(version), b.spans, int(rows))
	if err != nil {
		return fail(err)
	}
	r := b.b
	b.pin.Unpin()
	*out = C.shmsteer_batch_info{}
	out.version = C.uint64_t(r.Version)
	out.checksum = C.uint64_t(r.Checksum)
	out.slots = C.uint32_t(r.NumSlots)
	out.index, out.rows = (*C.int32_t)(b.pinned(unsafe.Pointer(unsafe.SliceData(r.Index)), len(r.Index))), C.size_t(len(r.Index))
	out.sites = (*C.int32_t)(b.pinned(unsafe.Pointer(unsafe.SliceData(r.Sites)), len(r.Sites)))
	out.site_clamps = (*C.int32_t)(b.pinned(unsafe.Pointer(unsafe.SliceData(r.SiteClamps)), len(r.SiteClamps)))
	out.n_sites = C.size_t(len(r.Sites))
	out.updates = (*C.int32_t)(b.pinned(unsafe.Pointer(unsafe.SliceData(r.Updates)), len(r.Updates)))
	out.n_updates = C.size_t(len(r.Updates))
	out.stage = (*C.float)(b.pinned(unsafe.Pointer(unsafe.SliceData(r.Stage)), len(r.Stage)))
	out.clamp_dirs = (*C.float)(b.pinned(unsafe.Pointer(unsafe.SliceData(r.ClampDirs)), len(r.ClampDirs)))
	out.clamp_params = (*C.float)(b.pinned(unsafe.Pointer(unsafe.SliceData(r.ClampParams)), len(r.ClampParams)))
	out.n_clamps = C.size_t(len(r.ClampParams) / 3)
	g, og := &r.Gates, &out.gates
	og.cols, og.slots = C.uint32_t(g.Cols), C.uint32_t(g.Slots)
	og.rows = (*C.int32_t)(b.pinned(unsafe.Pointer(unsafe.SliceData(g.Rows)), len(g.Rows)))
	og.factor = (*C.float)(b.pinned(unsafe.Pointer(unsafe.SliceData(g.Factor)), len(g.Factor)))
	og.updates = (*C.int32_t)(b.pinned(unsafe.Pointer(unsafe.SliceData(g.Updates)), len(g.Updates)))
	og.n_updates = C.size_t(len(g.Updates))
	og.probe = (*C.float)(b.pinned(unsafe.Pointer(unsafe.SliceData(g.Probe)), len(g.Probe)))
	og.params = (*C.float)(b.pinned(unsafe.Pointer(unsafe.SliceData(g.Params)), len(g.Params)))
	og.adds = (*C.int32_t)(b.pinned(unsafe.Pointer(unsafe.SliceData(g.Adds)), len(g.Adds)))
	og.n_adds = C.size_t(len(g.Adds))
	og.add_stage = (*C.float)(b.pinned(unsafe.Pointer(unsafe.SliceData(g.AddStage)), len(g.AddStage)))
	og.sites = (*C.int32_t)(b.pinned(unsafe.Pointer(unsafe.SliceData(g.Sites)), len(g.Sites)))
	og.n_sites = C.size_t(len(g.Sites))
	if r.AwaitsReport() {
		og.report = 1
	}
	if flags&C.SHMSTEER_BATCH_END != 0 {
		_, vw, hw := st.st.PinWords()
		st.st.End()
		if st.plan != nil && flags == C.SHMSTEER_BATCH_END && vw != nil && steadyDevice(b, out) {
			C.capi_plan_arm_device(st.plan, h, rows, C.uint64_t(r.Version), (*C.uint64_t)(unsafe.Pointer(vw)), (*C.uint64_t)(unsafe.Pointer(hw)), spans, nSpans, out)
		}
	} else {
		st.planOpen(spans, nSpans)
	}
	return C.SHMSTEER_OK
}

// steadyDevice reports whether a device-path resolve's answer leaves the worker nothing to do
// but its gather-adds: no table row or clamp record to write, no gate, no capture. The same
// batch advanced at the same version would give the same answer (capi_plan_resolve gives it
// in C).
func steadyDevice(b *batch, out *C.shmsteer_batch_info) bool {
	g := &out.gates
	return out.n_updates == 0 && out.n_clamps == 0 && g.cols == 0 && g.n_updates == 0 && g.n_adds == 0 &&
		g.n_sites == 0 && g.report == 0 && len(b.b.CaptureSites) == 0
}

// pinned pins p (the first element of an n-element slice) for C and returns it; NULL for n = 0.
func (b *batch) pinned(p unsafe.Pointer, n int) unsafe.Pointer {
	if n == 0 || p == nil {
		return nil
	}
	b.pin.Pin(p)
	return p
}

//export shmsteerGo_batch_report
func shmsteerGo_batch_report(h C.uint64_t, scores *C.float, n C.size_t, sum *C.uint64_t) C.int {
	b, ok := getAs[*batch](uint64(h))
	if !ok {
		return badHandle("not a live shmsteer_batch_t")
	}
	st, rc := stepperOf(C.uint64_t(b.sth))
	if rc != C.SHMSTEER_OK {
		return badHandle("the batch's stepper was freed")
	}
	if scores == nil && n > 0 || n > math.MaxInt32 {
		return badArg("scores")
	}
	var sc []float32
	if n > 0 {
		sc = unsafe.Slice((*float32)(unsafe.Pointer(scores)), int(n))
	}
	if err := b.b.Report(sc); err != nil {
		return fail(err)
	}
	if sum != nil {
		*sum = C.uint64_t(st.st.GateChecksum())
	}
	return C.SHMSTEER_OK
}
