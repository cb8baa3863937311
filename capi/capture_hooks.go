package main

// Activation capture at the hooks: a stepper's capture ring (package capture's Worker and
// RingSink), shmsteer_stepper_capture for blocks of any dtype, and a batch's capture plan.

/*
#include <stdint.h>
#include <stdlib.h>
#include "shmsteer.h"
*/
import "C"

import (
	"fmt"
	"math"
	"runtime"
	"time"
	"unsafe"

	"github.com/shmsteer/shmsteer/capture"
	"github.com/shmsteer/shmsteer/steer"
)

// localCaller is the steer.Caller of an owner's own steppers: the hub's RPC handlers, called
// in process (an owner has no connection to itself).
type localCaller struct{ inst *instance }

func (l localCaller) Call(op uint16, req []byte) ([]byte, error) {
	h := l.inst.hubOps[op]
	if h == nil {
		return nil, fmt.Errorf("%w: this owner serves no capture (shmsteer_capture_serve)", capture.ErrNoHub)
	}
	return h(req)
}

//export shmsteerGo_stepper_capture_start
func shmsteerGo_stepper_capture_start(h C.uint64_t, opt *C.shmsteer_capture_options) C.int {
	st, rc := stepperOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	var o C.shmsteer_capture_options
	if opt != nil {
		o = *opt
	}
	if o.rank < 0 || o.writer_rank < 0 || o.wait_ns < 0 {
		return badArg(fmt.Sprintf("capture rank %d, writer_rank %d, wait_ns %d: none may be negative", o.rank, o.writer_rank, o.wait_ns))
	}
	co := steer.CaptureOptions{Rank: int(o.rank), WriterRank: int(o.writer_rank)}
	var w *capture.Worker
	if co.Rank == co.WriterRank {
		var caller steer.Caller
		switch sd := st.inst.side.(type) {
		case clientSide:
			caller = sd.Client
		default:
			caller = localCaller{st.inst}
		}
		var err error
		w, err = capture.RegisterWorker(caller, capture.WorkerOptions{Capacity: uint64(o.ring_bytes), Wait: time.Duration(o.wait_ns)})
		if err != nil {
			return fail(err)
		}
		co.Sink = w.Sink()
	}
	if err := st.st.SetCapture(co); err != nil {
		if w != nil {
			w.Close()
		}
		return fail(err)
	}
	if st.capw != nil {
		st.capw.Close()
	}
	st.capw = w
	return C.SHMSTEER_OK
}

//export shmsteerGo_stepper_capture_stop
func shmsteerGo_stepper_capture_stop(h C.uint64_t) C.int {
	st, rc := stepperOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	st.st.SetCapture(steer.CaptureOptions{})
	if st.capw != nil {
		st.capw.Close()
		st.capw = nil
	}
	return C.SHMSTEER_OK
}

func captureDtype(d C.int32_t) (steer.CaptureDtype, bool) {
	dt := steer.CaptureDtype(d)
	return dt, d > 0 && d < 256 && dt.Size() > 0
}

//export shmsteerGo_stepper_capture
func shmsteerGo_stepper_capture(h C.uint64_t, hook C.uint32_t, layer C.int32_t, rows unsafe.Pointer, nBytes C.size_t, dtype C.int32_t, spans *C.shmsteer_span, nSpans C.size_t) C.int {
	st, rc := stepperOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	dt, ok := captureDtype(dtype)
	src, okb := cbytes(rows, nBytes)
	if !ok || !okb || hook > math.MaxUint16 {
		return badArg("rows, dtype (SHMSTEER_CAPTURE_F32, _BF16, _F16) or hook")
	}
	var rc2 C.int
	if st.spans, rc2 = goSpans(st, st.spans, spans, nSpans); rc2 != C.SHMSTEER_OK {
		return rc2
	}
	err := st.st.Capture(steer.HookID(hook), int(layer), src, dt, st.spans)
	runtime.KeepAlive(rows)
	if err != nil {
		return fail(err)
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_batch_capture_plan
func shmsteerGo_batch_capture_plan(h C.uint64_t, out *C.shmsteer_batch_capture_plan) C.int {
	b, ok := getAs[*batch](uint64(h))
	if !ok {
		return badHandle("not a live shmsteer_batch_t")
	}
	if out == nil {
		return badArg("out must not be NULL")
	}
	r := b.b
	*out = C.shmsteer_batch_capture_plan{}
	if len(r.CaptureSites) == 0 {
		return C.SHMSTEER_OK
	}
	// Pinned with the resolve's other outputs (unpinned at the next resolve or free).
	out.sites = (*C.int32_t)(b.pinned(unsafe.Pointer(unsafe.SliceData(r.CaptureSites)), len(r.CaptureSites)))
	out.n_sites = C.size_t(len(r.CaptureSites))
	out.start = (*C.int32_t)(b.pinned(unsafe.Pointer(unsafe.SliceData(r.CaptureStart)), len(r.CaptureStart)))
	out.rows = (*C.int32_t)(b.pinned(unsafe.Pointer(unsafe.SliceData(r.CaptureRows)), len(r.CaptureRows)))
	out.n_rows = C.size_t(len(r.CaptureRows))
	return C.SHMSTEER_OK
}

//export shmsteerGo_batch_capture
func shmsteerGo_batch_capture(h C.uint64_t, site C.int32_t, dtype C.int32_t, data unsafe.Pointer, nBytes C.size_t) C.int {
	b, ok := getAs[*batch](uint64(h))
	if !ok {
		return badHandle("not a live shmsteer_batch_t")
	}
	if _, rc := stepperOf(C.uint64_t(b.sth)); rc != C.SHMSTEER_OK {
		return badHandle("the batch's stepper was freed")
	}
	dt, ok := captureDtype(dtype)
	src, okb := cbytes(data, nBytes)
	if !ok || !okb {
		return badArg("data or dtype (SHMSTEER_CAPTURE_F32, _BF16, _F16)")
	}
	err := b.b.Capture(int32(site), dt, src)
	runtime.KeepAlive(data)
	if err != nil {
		return fail(err)
	}
	return C.SHMSTEER_OK
}
