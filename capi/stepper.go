package main

// shmsteer_stepper_t: one goroutine's step apply.

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

	"github.com/shmsteer/shmsteer/capture"
	"github.com/shmsteer/shmsteer/steer"
)

type stepper struct {
	capw  *capture.Worker // its capture ring (shmsteer_stepper_capture_start); nil: none
	inst  *instance
	st    *steer.Stepper
	spans []steer.Span
	ids   map[string]string // interned request ids: Stepper keeps the strings it is given
	// plan is its plain sites in C (plan.c; nil: none), layers the model's, adds scratch.
	plan   *C.capi_plan
	layers int
	adds   []steer.PlainAdd
	// exported is the program generation whose plain sites a native resolve last handed the
	// plan (planExport; 0: none).
	exported uint64
	order    []uint32 // planExpectEnd's scratch: the sites a step's end is armed for
}

//export shmsteerGo_stepper_new
func shmsteerGo_stepper_new(h C.uint64_t, out *C.uint64_t) C.int {
	inst, rc := engineOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	if out == nil {
		return badArg("out must not be NULL")
	}
	st := &stepper{inst: inst, st: inst.eng.NewStepper(), ids: map[string]string{}}
	if rc := store(st, out); rc != C.SHMSTEER_OK {
		return rc
	}
	st.planRegister(uint64(*out))
	return C.SHMSTEER_OK
}

//export shmsteerGo_stepper_free
func shmsteerGo_stepper_free(h C.uint64_t) C.int {
	st, ok := getAs[*stepper](uint64(h))
	if !ok || !handles.remove(uint64(h)) {
		return badHandle("shmsteer_stepper_free")
	}
	st.settle(false) // a step C ended is ended in Go first: Close must not unpin its slot again
	C.capi_plan_unregister(st.plan)
	st.st.Close()
	if st.capw != nil {
		st.capw.Close()
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_stepper_set_strict
func shmsteerGo_stepper_set_strict(h C.uint64_t, strict C.int32_t) C.int {
	st, rc := stepperOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	st.st.SetStrictRequests(strict != 0)
	return C.SHMSTEER_OK
}

// stepperOf returns the stepper behind h, its C applies replayed and its plan closed (plan.go):
// what every call but an apply needs before it reads or changes the step.
func stepperOf(h C.uint64_t) (*stepper, C.int) {
	return stepperSettled(h, false)
}

// stepperSettled is stepperOf, the plan kept open when keep (an apply: planAfterApply decides).
func stepperSettled(h C.uint64_t, keep bool) (*stepper, C.int) {
	st, ok := getAs[*stepper](uint64(h))
	if !ok {
		return nil, badHandle("not a live shmsteer_stepper_t")
	}
	if rc := st.settle(keep); rc != C.SHMSTEER_OK {
		return nil, rc
	}
	return st, C.SHMSTEER_OK
}

//export shmsteerGo_stepper_begin
func shmsteerGo_stepper_begin(h C.uint64_t, version C.uint64_t, pinned *C.uint64_t) C.int {
	st, rc := stepperOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	if err := st.st.Begin(uint64(version)); err != nil {
		return fail(err)
	}
	if pinned != nil {
		*pinned = C.uint64_t(st.st.Version())
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_stepper_end
func shmsteerGo_stepper_end(h C.uint64_t, checksum *C.uint64_t) C.int {
	st, ok := getAs[*stepper](uint64(h))
	if !ok {
		return badHandle("not a live shmsteer_stepper_t")
	}
	sum, rc := st.planEnd()
	if rc != C.SHMSTEER_OK {
		return rc
	}
	if checksum != nil {
		*checksum = C.uint64_t(sum)
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_stepper_stats
func shmsteerGo_stepper_stats(h C.uint64_t, out *C.shmsteer_step_stats) C.int {
	st, rc := stepperOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	if out == nil {
		return badArg("out must not be NULL")
	}
	s := st.st.Stats()
	*out = C.shmsteer_step_stats{steps: C.uint64_t(s.Steps), applies: C.uint64_t(s.Applies), recomposes: C.uint64_t(s.Recomposes),
		missing_refs: C.uint64_t(s.MissingRefs), unknown_requests: C.uint64_t(s.UnknownRequests),
		gate_evaluations: C.uint64_t(s.GateEvaluations), gate_fires: C.uint64_t(s.GateFires),
		gate_reports_missed: C.uint64_t(s.GateReportsMissed), gate_checksum: C.uint64_t(st.st.GateChecksum())}
	for i, g := range s.GateScopes {
		out.gate_scopes[i] = [3]C.uint64_t{C.uint64_t(g.Evaluations), C.uint64_t(g.Fires), C.uint64_t(g.Engaged)}
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_stepper_report_gates
func shmsteerGo_stepper_report_gates(h C.uint64_t, worker *C.char, n C.size_t) C.int {
	st, rc := stepperOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	w, ok := cbytes(unsafe.Pointer(worker), n)
	if !ok || n == 0 || n > steer.MaxWorkerName {
		return badArg(fmt.Sprintf("worker name of %d bytes: want 1..%d", n, steer.MaxWorkerName))
	}
	c, ok := st.inst.side.(clientSide)
	if !ok {
		return fail(fmt.Errorf("%w: this process is the owner, nobody collects its gate counts: read them with shmsteer_stepper_stats", steer.ErrNotServed))
	}
	if err := steer.ReportGates(c.Client, string(w), steer.GateReportOf(st.st.Stats())); err != nil {
		return fail(err)
	}
	return C.SHMSTEER_OK
}

// intern returns a Go copy of id that the stepper may keep, allocating only for an id it has
// not seen (the map lookup with string(b) does not allocate).
func (st *stepper) intern(b []byte) string {
	if s, ok := st.ids[string(b)]; ok {
		return s
	}
	if len(st.ids) >= 1<<14 {
		clear(st.ids)
	}
	s := string(b)
	st.ids[s] = s
	return s
}

//export shmsteerGo_stepper_apply
func shmsteerGo_stepper_apply(h C.uint64_t, hook C.uint32_t, layer C.int32_t, rows *C.float, nFloats C.size_t, spans *C.shmsteer_span, nSpans C.size_t) C.int {
	st, rc := stepperSettled(h, true)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	if (rows == nil && nFloats > 0) || (spans == nil && nSpans > 0) || uint64(nFloats) > math.MaxInt || uint64(nSpans) > math.MaxInt32 || hook > math.MaxUint16 {
		return badArg("rows, spans or hook")
	}
	var rc2 C.int
	if st.spans, rc2 = goSpans(st, st.spans, spans, nSpans); rc2 != C.SHMSTEER_OK {
		return rc2
	}
	var h32 []float32
	if nFloats > 0 {
		h32 = unsafe.Slice((*float32)(unsafe.Pointer(rows)), int(nFloats))
	}
	err := st.st.Apply(steer.HookID(hook), int(layer), h32, st.spans)
	runtime.KeepAlive(rows)
	st.planAfterApply(err == nil, hook, layer, spans, nSpans)
	if err != nil {
		return fail(err)
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_stepper_apply_bf16
func shmsteerGo_stepper_apply_bf16(h C.uint64_t, hook C.uint32_t, layer C.int32_t, rows *C.uint16_t, nValues C.size_t, spans *C.shmsteer_span, nSpans C.size_t) C.int {
	st, rc := stepperSettled(h, true)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	if (rows == nil && nValues > 0) || (spans == nil && nSpans > 0) || uint64(nValues) > math.MaxInt/2 || uint64(nSpans) > math.MaxInt32 || hook > math.MaxUint16 {
		return badArg("rows, spans or hook")
	}
	var rc2 C.int
	if st.spans, rc2 = goSpans(st, st.spans, spans, nSpans); rc2 != C.SHMSTEER_OK {
		return rc2
	}
	var raw []byte
	if nValues > 0 {
		raw = unsafe.Slice((*byte)(unsafe.Pointer(rows)), 2*int(nValues))
	}
	err := st.st.ApplyBF16(steer.HookID(hook), int(layer), raw, st.spans)
	runtime.KeepAlive(rows)
	st.planAfterApply(err == nil, hook, layer, spans, nSpans)
	if err != nil {
		return fail(err)
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_stepper_bind
func shmsteerGo_stepper_bind(h C.uint64_t, spans *C.shmsteer_span, nSpans C.size_t, nRows C.size_t) C.int {
	st, rc := stepperOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	if (spans == nil && nSpans > 0) || uint64(nSpans) > math.MaxInt32 || uint64(nRows) > math.MaxInt32 {
		return badArg("spans or n_rows")
	}
	var rc2 C.int
	if st.spans, rc2 = goSpans(st, st.spans, spans, nSpans); rc2 != C.SHMSTEER_OK {
		return rc2
	}
	if err := st.st.Bind(st.spans, int(nRows)); err != nil {
		return fail(err)
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_stepper_apply_bound
func shmsteerGo_stepper_apply_bound(h C.uint64_t, hook C.uint32_t, layer C.int32_t, rows *C.float, nFloats C.size_t) C.int {
	st, rc := stepperOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	if (rows == nil && nFloats > 0) || uint64(nFloats) > math.MaxInt || hook > math.MaxUint16 {
		return badArg("rows or hook")
	}
	var h32 []float32
	if nFloats > 0 {
		h32 = unsafe.Slice((*float32)(unsafe.Pointer(rows)), int(nFloats))
	}
	err := st.st.ApplyBound(steer.HookID(hook), int(layer), h32)
	runtime.KeepAlive(rows)
	if err != nil {
		return fail(err)
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_stepper_effective
func shmsteerGo_stepper_effective(h C.uint64_t, id *C.char, idLen C.size_t, hook C.uint32_t, layer C.int32_t, phase C.int32_t, out *C.shmsteer_effective) C.int {
	st, rc := stepperOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	idb, ok := cbytes(unsafe.Pointer(id), idLen)
	if !ok || out == nil || hook > math.MaxUint16 {
		return badArg("id, hook or out")
	}
	eff, err := st.st.Effective(st.intern(idb), steer.HookID(hook), int(layer), steer.Phase(phase))
	if err != nil {
		return fail(err)
	}
	// Both views alias the shared mapping (not Go memory): C may hold them until the step ends.
	out.data, out.global_data, out.len = nil, nil, 0
	if len(eff.Request) > 0 {
		out.data, out.len = (*C.float)(unsafe.Pointer(&eff.Request[0])), C.size_t(len(eff.Request))
	}
	if len(eff.Global) > 0 {
		out.global_data, out.len = (*C.float)(unsafe.Pointer(&eff.Global[0])), C.size_t(len(eff.Global))
	}
	out.clamps = C.uint32_t(eff.Clamps)
	out.version = C.uint64_t(eff.Version)
	for i, b := range eff.Digest {
		out.digest[i] = C.uint8_t(b)
	}
	return C.SHMSTEER_OK
}
