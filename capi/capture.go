package main

// shmsteer_capture_t: an activation capture consumer (package capture's Consumer), and the
// owner's capture hub on a shmsteer_t started by shmsteer_owner_start.

/*
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "shmsteer.h"
*/
import "C"

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unsafe"

	"github.com/shmsteer/shmsteer/capture"
	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/kernels"
	"github.com/shmsteer/shmsteer/steer"
)

// captureConsumer is what a shmsteer_capture_t stands for. The strings an event names (request
// id, hook, spec) are copied into buf, C memory the handle owns; the record's data and
// positions point into the ring's mapping.
type captureConsumer struct {
	c     *capture.Consumer
	cl    *ipc.Client
	buf   unsafe.Pointer
	cap   int
	reqs  map[string]uint32 // request id → request_seq, from its begin to its end
	hooks map[string]uint32 // hook name → hook_seq
	next  uint32
	batch []capture.Event
}

// seq is id's number in m, assigned from k.next when new.
func (k *captureConsumer) seq(m map[string]uint32, id string) uint32 {
	n, ok := m[id]
	if !ok {
		k.next++
		n = k.next
		m[id] = n
	}
	return n
}

// scratch returns C memory of at least n bytes, valid until the next event.
func (k *captureConsumer) scratch(n int) unsafe.Pointer {
	if n > k.cap {
		C.free(k.buf)
		k.buf = C.malloc(C.size_t(n))
		k.cap = n
	}
	return k.buf
}

func (k *captureConsumer) free() {
	C.free(k.buf)
	k.buf, k.cap = nil, 0
}

var captureDtypes = map[capture.Dtype]C.int32_t{capture.Float32: 1, capture.BFloat16: 2, capture.Float16: 3}

//export shmsteerGo_capture_attach
func shmsteerGo_capture_attach(ns *C.char, secret unsafe.Pointer, secretLen C.size_t, secretFile *C.char, name *C.char, policy C.int32_t, boundNs C.int64_t, out *C.uint64_t) C.int {
	if out == nil || name == nil {
		return badArg("name and out must not be NULL")
	}
	sec, err := resolveSecret(secret, secretLen, secretFile)
	if err != nil {
		return fail(err)
	}
	cl, err := ipc.Attach(ipc.ClientOptions{Secret: sec, Namespace: goString(ns)})
	if err != nil {
		return fail(err)
	}
	c, err := capture.NewConsumer(cl, capture.ConsumerOptions{Name: C.GoString(name), Policy: capture.Policy(policy), Bound: time.Duration(boundNs)})
	if err != nil {
		cl.Close()
		return fail(err)
	}
	rc := store(&captureConsumer{c: c, cl: cl, reqs: map[string]uint32{}, hooks: map[string]uint32{}}, out)
	if rc != C.SHMSTEER_OK {
		c.Close()
		cl.Close()
	}
	return rc
}

func consumerOf(h C.uint64_t) (*captureConsumer, C.int) {
	k, ok := getAs[*captureConsumer](uint64(h))
	if !ok {
		return nil, badHandle("not a live shmsteer_capture_t")
	}
	return k, C.SHMSTEER_OK
}

//export shmsteerGo_capture_next
func shmsteerGo_capture_next(h C.uint64_t, timeoutMs C.int64_t, ev *C.shmsteer_capture_event) C.int {
	k, rc := consumerOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	if ev == nil || timeoutMs < 0 {
		return badArg("ev must not be NULL and timeout_ms not negative")
	}
	*ev = C.shmsteer_capture_event{}
	e, ok, err := k.c.Next(time.Duration(timeoutMs) * time.Millisecond)
	if err != nil {
		return fail(err)
	}
	if !ok {
		return C.SHMSTEER_OK
	}
	n := len(e.RequestID) + len(e.Spec) + len(e.Record.Hook)
	k.fill(ev, e, k.scratch(max(n, 1)))
	return C.SHMSTEER_OK
}

// fill writes event e into ev, its strings copied to p (C memory of their total length).
func (k *captureConsumer) fill(ev *C.shmsteer_capture_event, e capture.Event, p unsafe.Pointer) {
	ev.kind = C.int32_t(e.Kind)
	n := len(e.RequestID) + len(e.Spec) + len(e.Record.Hook)
	b := unsafe.Slice((*byte)(p), max(n, 1))
	o := copy(b, e.RequestID)
	ev.request_id, ev.request_id_len = (*C.char)(p), C.size_t(len(e.RequestID))
	ev.request_seq = C.uint32_t(k.seq(k.reqs, e.RequestID))
	switch e.Kind {
	case capture.EventBegin:
		copy(b[o:], e.Spec)
		ev.spec, ev.spec_len = (*C.char)(unsafe.Add(p, o)), C.size_t(len(e.Spec))
		ev.prompt_len = C.int64_t(e.PromptLen)
	case capture.EventEnd:
		ev.dropped = C.uint64_t(e.Dropped)
		delete(k.reqs, e.RequestID)
	case capture.EventRecord:
		r := e.Record
		copy(b[o:], r.Hook)
		ev.hook, ev.hook_len = (*C.char)(unsafe.Add(p, o)), C.size_t(len(r.Hook))
		ev.ring = C.uint32_t(e.Ring)
		ev.layer = C.int32_t(r.Layer)
		ev.dtype = captureDtypes[r.Dtype]
		ev.rows, ev.width = C.int64_t(r.Rows), C.int64_t(r.Width)
		// Views of the ring's mapping (not Go memory): valid until the next call.
		ev.positions = (*C.uint32_t)(unsafe.Pointer(unsafe.SliceData(r.PositionsLE)))
		ev.data, ev.nbytes = unsafe.Pointer(unsafe.SliceData(r.Data)), C.size_t(len(r.Data))
		ev.hook_seq = C.uint32_t(k.seq(k.hooks, r.Hook))
		if rd := k.c.RingData(e.Ring); len(rd) > 0 {
			base := unsafe.Pointer(unsafe.SliceData(rd))
			ev.ring_base, ev.ring_len = base, C.size_t(len(rd))
			ev.data_off = C.size_t(uintptr(ev.data) - uintptr(base))
			ev.positions_off = C.size_t(uintptr(unsafe.Pointer(ev.positions)) - uintptr(base))
		}
	}
}

//export shmsteerGo_capture_next_batch
func shmsteerGo_capture_next_batch(h C.uint64_t, timeoutMs C.int64_t, evs *C.shmsteer_capture_event, maxN C.size_t, n *C.size_t) C.int {
	k, rc := consumerOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	if evs == nil || n == nil || timeoutMs < 0 || maxN < 1 || maxN > 1<<16 {
		return badArg("evs and n must not be NULL, timeout_ms not negative, max in [1, 65536]")
	}
	*n = 0
	var err error
	k.batch, err = k.c.NextBatch(k.batch[:0], int(maxN), time.Duration(timeoutMs)*time.Millisecond)
	if err != nil {
		return fail(err)
	}
	total := 0
	for _, e := range k.batch {
		total += len(e.RequestID) + len(e.Spec) + len(e.Record.Hook)
	}
	p := k.scratch(max(total, 1))
	out := unsafe.Slice(evs, int(maxN))
	o := 0
	for i, e := range k.batch {
		out[i] = C.shmsteer_capture_event{}
		k.fill(&out[i], e, unsafe.Add(p, o))
		o += len(e.RequestID) + len(e.Spec) + len(e.Record.Hook)
	}
	*n = C.size_t(len(k.batch))
	return C.SHMSTEER_OK
}

//export shmsteerGo_capture_release
func shmsteerGo_capture_release(h C.uint64_t) C.int {
	k, rc := consumerOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	k.c.Release()
	return C.SHMSTEER_OK
}

//export shmsteerGo_capture_publish
func shmsteerGo_capture_publish(h C.uint64_t, id *C.char, idLen C.size_t, status C.int32_t, msg *C.char, payload *C.char, payloadLen C.size_t) C.int {
	k, rc := consumerOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	rid, ok := cstr(id, idLen)
	pl, ok2 := cstr(payload, payloadLen)
	if !ok || !ok2 || status < 0 || status > 255 {
		return badArg("request id or payload pointer and length, or status")
	}
	r := capture.Result{Status: capture.Status(status), Error: goString(msg), Payload: json.RawMessage(pl)}
	if err := k.c.Publish(rid, r); err != nil {
		return fail(err)
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_capture_stats
func shmsteerGo_capture_stats(h C.uint64_t, out *C.shmsteer_capture_stats) C.int {
	k, rc := consumerOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	if out == nil {
		return badArg("out must not be NULL")
	}
	s := k.c.Stats()
	*out = C.shmsteer_capture_stats{rings: C.int64_t(s.Rings), received: C.uint64_t(s.Received), dropped: C.uint64_t(s.Dropped),
		skipped: C.uint64_t(s.Skipped), lag: C.uint64_t(s.Lag)}
	return C.SHMSTEER_OK
}

//export shmsteerGo_capture_close
func shmsteerGo_capture_close(h C.uint64_t) C.int {
	k, ok := getAs[*captureConsumer](uint64(h))
	if !ok || !handles.remove(uint64(h)) {
		return badHandle("shmsteer_capture_close")
	}
	k.c.Close()
	k.free()
	if err := k.cl.Close(); err != nil {
		return fail(err)
	}
	return C.SHMSTEER_OK
}

// ownerHub is the owner instance's capture hub, or an error code when h is not an owner with
// one.
func ownerHub(h C.uint64_t) (*capture.Hub, C.int) {
	inst, rc := instanceOf(h)
	if rc != C.SHMSTEER_OK {
		return nil, rc
	}
	if inst.hub == nil {
		return nil, fail(capture.ErrNoHub)
	}
	return inst.hub, C.SHMSTEER_OK
}

//export shmsteerGo_capture_serve
func shmsteerGo_capture_serve(h C.uint64_t, consumers *C.char) C.int {
	inst, rc := instanceOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	o, ok := inst.side.(ownerSide)
	if !ok {
		return fail(steer.ErrNotOwner)
	}
	if inst.hub != nil {
		return badArg("the owner serves capture already")
	}
	decl, err := parseDeclarations(goString(consumers))
	if err != nil {
		return fail(err)
	}
	validators, err := capture.Validators(decl)
	if err != nil {
		return fail(err)
	}
	hub, err := capture.NewHub(capture.HubOptions{Consumers: decl, Logger: quietLogger()})
	if err != nil {
		return fail(err)
	}
	ops := map[uint16]func([]byte) ([]byte, error){}
	hub.Serve(func(op uint16, hf func([]byte) ([]byte, error)) { o.Handle(op, hf); ops[op] = hf })
	inst.hub, inst.hubOps = hub, ops
	o.steer.SetCaptureConsumers(validators) // admissions may name them from now on
	return C.SHMSTEER_OK
}

// parseDeclarations reads shmsteer_capture_serve's "NAME=TYPE[,NAME=TYPE...]" as serve reads
// its --capture-consumer list (capture.ParseDeclaration each): ErrInvalidArgument for an empty
// list, capture.ErrConsumerType for an entry without "=" or of an unknown type,
// capture.ErrBadConsumer for a bad name or one declared twice.
func parseDeclarations(list string) (map[string]string, error) {
	if strings.TrimSpace(list) == "" {
		return nil, fmt.Errorf("%w: consumers: declare at least one, NAME=TYPE[,NAME=TYPE...]", ErrInvalidArgument)
	}
	decl := map[string]string{}
	for _, d := range strings.Split(list, ",") {
		name, typ, err := capture.ParseDeclaration(strings.TrimSpace(d))
		if err != nil {
			return nil, err
		}
		if _, ok := decl[name]; ok {
			return nil, fmt.Errorf("%w: consumer %q declared twice", capture.ErrBadConsumer, name)
		}
		decl[name] = typ
	}
	return decl, nil
}

//export shmsteerGo_capture_result_json
func shmsteerGo_capture_result_json(h C.uint64_t, id *C.char, idLen C.size_t, buf *C.char, capacity C.size_t, n *C.size_t) C.int {
	hub, rc := ownerHub(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	rid, ok := cstr(id, idLen)
	if !ok {
		return badArg("request id pointer or length")
	}
	res, _ := hub.Result(rid)
	b, err := json.Marshal(res)
	if err != nil {
		return fail(err)
	}
	return writeOut(b, buf, capacity, n)
}

// runRecs is a run's shmsteer_capture_rec array as Go sees it.
func runRecs(recs *C.shmsteer_capture_rec, n int) []C.shmsteer_capture_rec {
	return unsafe.Slice(recs, n)
}

// streamRun is the smallest run copy_run copies with non-temporal stores (as Go's copy and
// glibc's memcpy do from about this size): below it the rows are likely still in the
// reader's cache when it reads them.
const streamRun = 1 << 20

//export shmsteerGo_capture_next_run
func shmsteerGo_capture_next_run(h C.uint64_t, timeoutMs C.int64_t, ev *C.shmsteer_capture_event, recs *C.shmsteer_capture_rec,
	maxN C.size_t, n *C.size_t, copyOut C.int, dst unsafe.Pointer, dstCap C.size_t, pos *C.uint32_t, posCap C.size_t) C.int {
	k, rc := consumerOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	if ev == nil || recs == nil || n == nil || timeoutMs < 0 || maxN < 1 || maxN > capture.MaxRun {
		return badArg("ev, recs and n must not be NULL, timeout_ms not negative, max in [1, 65536]")
	}
	opt := capture.RunOptions{Max: int(maxN), Contiguous: copyOut == 0}
	var out, outPos []byte
	if copyOut != 0 {
		if dst == nil || pos == nil || dstCap < 1 || posCap < 1 || uint64(dstCap) > 1<<40 || uint64(posCap) > math.MaxInt32 {
			return badArg("dst and positions must not be NULL, dst_cap in [1, 2^40], positions_cap in [1, 2^31)")
		}
		out = unsafe.Slice((*byte)(dst), int(dstCap))
		outPos = unsafe.Slice((*byte)(unsafe.Pointer(pos)), 4*int(posCap))
		opt.MaxBytes, opt.MaxRows = int(dstCap), int(posCap)
	}
	*n = 0
	*ev = C.shmsteer_capture_event{}
	var err error
	k.batch, err = k.c.NextRun(k.batch[:0], opt, time.Duration(timeoutMs)*time.Millisecond)
	if tl := (*capture.RunTooLargeError)(nil); errors.As(err, &tl) {
		ev.nbytes, ev.rows = C.size_t(tl.Bytes), C.int64_t(tl.Rows)
	}
	if err != nil {
		return fail(err)
	}
	if len(k.batch) == 0 {
		return C.SHMSTEER_OK
	}
	first := k.batch[0]
	k.fill(ev, first, k.scratch(max(len(first.RequestID)+len(first.Spec)+len(first.Record.Hook), 1)))
	if first.Kind != capture.EventRecord {
		return C.SHMSTEER_OK
	}
	rs := runRecs(recs, len(k.batch))
	hookSeq := C.uint32_t(ev.hook_seq) // the run's one hook
	stream := copyOut != 0 && len(k.batch)*len(first.Record.Data) >= streamRun
	for i := range k.batch {
		r := &k.batch[i].Record
		rs[i] = C.shmsteer_capture_rec{request_seq: C.uint32_t(k.seq(k.reqs, r.RequestID)), hook_seq: hookSeq,
			layer: C.int32_t(r.Layer), data_off: C.uint64_t(r.DataOff), positions_off: C.uint64_t(r.PositionsOff)}
		if copyOut != 0 {
			o, p := i*len(r.Data), i*len(r.PositionsLE)
			if stream {
				kernels.StreamCopy(out[o:], r.Data)
			} else {
				copy(out[o:], r.Data)
			}
			copy(outPos[p:], r.PositionsLE)
			rs[i].data_off, rs[i].positions_off = C.uint64_t(o), C.uint64_t(i*r.Rows)
		}
	}
	if copyOut != 0 {
		kernels.StoreFence() // the non-temporal stores before the caller reads dst
		clear(k.batch)       // no view of the ring stays behind
		k.c.Release()
		ev.data, ev.positions, ev.data_off, ev.positions_off, ev.ring_base, ev.ring_len = nil, nil, 0, 0, nil, 0
	}
	*n = C.size_t(len(k.batch))
	return C.SHMSTEER_OK
}
