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
