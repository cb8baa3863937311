package main

// The stepper's C ABI calls with Go arguments, for the tests of plan.c (which cannot use cgo):
// each is what a C caller's call of the wrapper does.

/*
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "shmsteer.h"
#include "plan.h"
*/
import "C"

import (
	"sync/atomic"
	"unsafe"

	"github.com/shmsteer/shmsteer/steer"
)

// cSpans is a batch in C memory, as a C caller passes it.
type cSpans struct {
	p *C.shmsteer_span
	n int
}

// newCSpans copies spans, ids included, to C memory; free releases it.
func newCSpans(spans []steer.Span) *cSpans {
	c := &cSpans{n: len(spans)}
	if len(spans) == 0 {
		return c
	}
	c.p = (*C.shmsteer_span)(C.calloc(C.size_t(len(spans)), C.size_t(unsafe.Sizeof(C.shmsteer_span{}))))
	cs := unsafe.Slice(c.p, len(spans))
	for i := range cs {
		s := &cs[i]
		s.id = C.CString(spans[i].ID)
		s.id_len = C.size_t(len(spans[i].ID))
		s.start, s.end = C.int64_t(spans[i].Start), C.int64_t(spans[i].End)
		s.phase, s.first_position = C.int32_t(spans[i].Phase), C.int32_t(spans[i].Pos)
	}
	return c
}

// setID rewrites span i's id bytes in place (the same pointer and length).
func (c *cSpans) setID(i int, id string) {
	s := &unsafe.Slice(c.p, c.n)[i]
	C.memcpy(unsafe.Pointer(s.id), unsafe.Pointer(unsafe.StringData(id)), C.size_t(len(id)))
}

func (c *cSpans) free() {
	for _, s := range unsafe.Slice(c.p, c.n) {
		C.free(unsafe.Pointer(s.id))
	}
	C.free(unsafe.Pointer(c.p))
}

// probeStepper makes a stepper handle on eng as shmsteer_stepper_new does; without its plan
// (every apply in Go) unless withPlan.
func probeStepper(eng *steer.Engine, withPlan bool) uint64 {
	st := &stepper{inst: &instance{eng: eng, cfg: eng.Config()}, st: eng.NewStepper(), ids: map[string]string{}}
	h := handles.put(st)
	if withPlan {
		st.planRegister(h)
	}
	return h
}

func probeFree(h uint64) int { return int(shmsteerGo_stepper_free(C.uint64_t(h))) }

func probeBegin(h uint64) int { return int(shmsteerGo_stepper_begin(C.uint64_t(h), 0, nil)) }

func probeEnd(h uint64) (uint64, int) {
	var sum C.uint64_t
	rc := shmsteerGo_stepper_end(C.uint64_t(h), &sum)
	return uint64(sum), int(rc)
}

// probeApply is shmsteer_stepper_apply (bf16: _apply_bf16) on n values at rows: the plan's
// apply first, then Go's; inC reports that the plan applied.
func probeApply(h uint64, hook uint32, layer int32, rows unsafe.Pointer, n int, bf16 bool, spans *cSpans) (rc int, inC bool) {
	b := C.int(0)
	if bf16 {
		b = 1
	}
	if C.capi_plan_apply(C.uint64_t(h), C.uint32_t(hook), C.int32_t(layer), rows, C.size_t(n), b, spans.p, C.size_t(spans.n)) != 0 {
		return 0, true
	}
	if bf16 {
		return int(shmsteerGo_stepper_apply_bf16(C.uint64_t(h), C.uint32_t(hook), C.int32_t(layer), (*C.uint16_t)(rows), C.size_t(n), spans.p, C.size_t(spans.n))), false
	}
	return int(shmsteerGo_stepper_apply(C.uint64_t(h), C.uint32_t(hook), C.int32_t(layer), (*C.float)(rows), C.size_t(n), spans.p, C.size_t(spans.n))), false
}

// probeStats is the stepper's steer.StepStats after its C applies are replayed.
func probeStats(h uint64) steer.StepStats {
	st, rc := stepperOf(C.uint64_t(h))
	if rc != C.SHMSTEER_OK {
		return steer.StepStats{}
	}
	return st.st.Stats()
}

// probeBatch is shmsteer_batch_new on stepper h with the default options, restricted to sites
// (shmsteer_batch_sites; nil: every site); 0 on failure.
func probeBatch(h uint64, sites []int32) uint64 {
	var out C.uint64_t
	if shmsteerGo_batch_new(C.uint64_t(h), nil, &out) != C.SHMSTEER_OK {
		return 0
	}
	if probeSetSites(uint64(out), sites) != 0 {
		return 0
	}
	return uint64(out)
}

// probeSetSites is shmsteer_batch_sites.
func probeSetSites(b uint64, sites []int32) int {
	var p *C.int32_t
	if len(sites) > 0 {
		p = (*C.int32_t)(unsafe.Pointer(&sites[0]))
	}
	return int(shmsteerGo_batch_sites(C.uint64_t(b), p, C.size_t(len(sites))))
}

// probeResolveNative is shmsteer_batch_resolve with SHMSTEER_BATCH_NATIVE at the current
// version: the step begun and left open for the stepper's applies; its batch checksum.
func probeResolveNative(b uint64, spans *cSpans, rows int) (uint64, int) {
	var info C.shmsteer_batch_info
	rc := shmsteerGo_batch_resolve(C.uint64_t(b), 0, spans.p, C.size_t(spans.n), C.int64_t(rows), C.SHMSTEER_BATCH_NATIVE, &info)
	return uint64(info.checksum), int(rc)
}

// probeEndC is shmsteer_stepper_end: the plan's end first (capi_plan_end), then Go's; inC
// reports that the plan ended the step.
func probeEndC(h uint64) (sum uint64, rc int, inC bool) {
	var s C.uint64_t
	if C.capi_plan_end(C.uint64_t(h), &s) != 0 {
		return uint64(s), 0, true
	}
	rc = int(shmsteerGo_stepper_end(C.uint64_t(h), &s))
	return uint64(s), rc, false
}

// probePin reads the pin word of stepper h's step as Go last saw it open (ok false: Go sees no
// open step), without settling the stepper.
func probePin(h uint64) (pin uint64, ok bool) {
	st, found := getAs[*stepper](h)
	if !found {
		return 0, false
	}
	w, _, _ := st.st.PinWords()
	if w == nil {
		return 0, false
	}
	return atomic.LoadUint64(w), true
}

// probeResolveC is shmsteer_batch_resolve with SHMSTEER_BATCH_NATIVE at the current version:
// the plan's begin first (capi_plan_resolve), then Go's; inC reports that the plan began it.
func probeResolveC(b uint64, spans *cSpans, rows int) (sum uint64, rc int, inC bool) {
	var info C.shmsteer_batch_info
	if C.capi_plan_resolve(C.uint64_t(b), 0, spans.p, C.size_t(spans.n), C.int64_t(rows), C.SHMSTEER_BATCH_NATIVE, &info) != 0 {
		return uint64(info.checksum), 0, true
	}
	rc = int(shmsteerGo_batch_resolve(C.uint64_t(b), 0, spans.p, C.size_t(spans.n), C.int64_t(rows), C.SHMSTEER_BATCH_NATIVE, &info))
	return uint64(info.checksum), rc, false
}

func probeBatchFree(b uint64) int { return int(shmsteerGo_batch_free(C.uint64_t(b))) }

// probeDevice is what a device-path resolve answered, copied out of C memory.
type probeDevice struct {
	Version, Checksum  uint64
	Slots              uint32
	Index, Sites       []int32
	Updates, Clamps    int
	GateCols, GateRept uint32
	IndexAt            uintptr // the index buffer's address (the Go batch's, pinned)
}

// probeResolveDevice is shmsteer_batch_resolve with flags at version (0: current): the plan's
// answer first (capi_plan_resolve), then Go's; inC reports that the plan answered.
func probeResolveDevice(b uint64, spans *cSpans, rows int, flags uint32, version uint64) (r probeDevice, rc int, inC bool) {
	var info C.shmsteer_batch_info
	v := C.uint64_t(version)
	if C.capi_plan_resolve(C.uint64_t(b), v, spans.p, C.size_t(spans.n), C.int64_t(rows), C.uint32_t(flags), &info) != 0 {
		inC = true
	} else {
		rc = int(shmsteerGo_batch_resolve(C.uint64_t(b), v, spans.p, C.size_t(spans.n), C.int64_t(rows), C.uint32_t(flags), &info))
	}
	r = probeDevice{Version: uint64(info.version), Checksum: uint64(info.checksum), Slots: uint32(info.slots),
		Updates: int(info.n_updates), Clamps: int(info.n_clamps), GateCols: uint32(info.gates.cols), GateRept: uint32(info.gates.report),
		IndexAt: uintptr(unsafe.Pointer(info.index))}
	if info.rows > 0 {
		r.Index = append([]int32(nil), unsafe.Slice((*int32)(unsafe.Pointer(info.index)), int(info.rows))...)
	}
	if info.n_sites > 0 {
		r.Sites = append([]int32(nil), unsafe.Slice((*int32)(unsafe.Pointer(info.sites)), int(info.n_sites))...)
	}
	return r, rc, inC
}

// probeInfo is probeResolveGo's answer buffer, in C memory as a worker's is (made once, so
// that the probe itself allocates nothing).
var probeInfo = (*C.shmsteer_batch_info)(C.calloc(1, C.size_t(unsafe.Sizeof(C.shmsteer_batch_info{}))))

// probeResolveGo resolves spans over rows rows through Go's shmsteerGo_batch_resolve (never
// C's answer) with flags, at version (0: current); its return code. It allocates nothing of
// its own, so that a test can count what the resolve allocates.
func probeResolveGo(b uint64, spans *cSpans, rows int, flags uint32, version uint64) int {
	return int(shmsteerGo_batch_resolve(C.uint64_t(b), C.uint64_t(version), spans.p, C.size_t(spans.n), C.int64_t(rows),
		C.uint32_t(flags), probeInfo))
}

// probeBatchStats is batch b's counters after its stepper counted what C did.
func probeBatchStats(b uint64) steer.BatchStats {
	bt, ok := getAs[*batch](b)
	if !ok {
		return steer.BatchStats{}
	}
	if _, rc := stepperOf(C.uint64_t(bt.sth)); rc != C.SHMSTEER_OK {
		return steer.BatchStats{}
	}
	return bt.b.Stats()
}

const (
	probeFlagEnd   = uint32(C.SHMSTEER_BATCH_END)
	probeFlagReset = uint32(C.SHMSTEER_BATCH_RESET)
)
