package main

// Steering writes through a shmsteer_t: in an owner a local transaction, in a worker an RPC
// to the owner (steer.Engine's writer).

/*
#include <stdint.h>
#include <stdlib.h>
#include "shmsteer.h"
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"unsafe"

	"github.com/shmsteer/shmsteer/capture"
	"github.com/shmsteer/shmsteer/steer"
)

// vectorListJSON lists the named vectors of kind at a snapshot as JSON.
func vectorListJSON(kind steer.VectorKind, h C.uint64_t, buf *C.char, capacity C.size_t, n *C.size_t) C.int {
	sn, ok := getAs[*snapshot](uint64(h))
	if !ok {
		return badHandle("not a live shmsteer_snapshot_t")
	}
	if sn.inst.eng == nil {
		return fail(fmt.Errorf("the region records no steering model: %w", sn.inst.engErr))
	}
	infosOf := sn.inst.eng.VectorInfos
	if kind == steer.VectorProbe {
		infosOf = sn.inst.eng.ProbeInfos
	}
	infos, err := infosOf(&sn.snap)
	if err != nil {
		return fail(err)
	}
	type entry struct {
		Name      string `json:"name"`
		Version   uint64 `json:"version"`
		Digest    string `json:"digest"`
		ModelHint string `json:"model_hint,omitempty"`
	}
	list := make([]entry, 0, len(infos))
	for _, vi := range infos {
		list = append(list, entry{vi.Name, vi.Version, vi.Digest.String(), vi.ModelHint})
	}
	b, err := json.Marshal(list)
	if err != nil {
		return fail(err)
	}
	return writeOut(b, buf, capacity, n)
}

//export shmsteerGo_vector_register
func shmsteerGo_vector_register(h C.uint64_t, name *C.char, nameLen C.size_t, entries *C.shmsteer_vector_entry, count C.size_t, version *C.uint64_t) C.int {
	return vectorRegister(steer.VectorSteer, h, name, nameLen, entries, count, version)
}

// vectorRegister registers a named vector of kind (a probe: exactly one entry).
func vectorRegister(kind steer.VectorKind, h C.uint64_t, name *C.char, nameLen C.size_t, entries *C.shmsteer_vector_entry, count C.size_t, version *C.uint64_t) C.int {
	inst, rc := engineOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	sname, ok := cstr(name, nameLen)
	if !ok || (entries == nil && count > 0) || uint64(count) > math.MaxInt32 {
		return badArg("name, entries or n")
	}
	var in []C.shmsteer_vector_entry
	if count > 0 {
		in = unsafe.Slice(entries, int(count))
	}
	vecs := make([]steer.Vector, len(in))
	for i, e := range in {
		hookName := inst.cfg.HookName(steer.HookID(e.hook))
		if e.hook > math.MaxUint16 || hookName == "" { // not its low 16 bits' hook
			return fail(fmt.Errorf("%w: hook id %d in entry %d", steer.ErrUnknownHook, e.hook, i))
		}
		if e.data == nil && e.len > 0 || uint64(e.len) > math.MaxInt32 {
			return badArg(fmt.Sprintf("entry %d data", i))
		}
		var data []float32
		if e.len > 0 {
			data = unsafe.Slice((*float32)(unsafe.Pointer(e.data)), int(e.len)) // encoded (copied) by Register
		}
		vecs[i] = steer.Vector{Hook: hookName, Layer: int(e.layer), Scale: float32(e.scale), Data: data}
	}
	reg := inst.eng.Register
	if kind == steer.VectorProbe {
		reg = inst.eng.RegisterProbe
	}
	vi, err := reg(strings.Clone(sname), vecs)
	return versionOut(version, vi.Version, err)
}

//export shmsteerGo_vector_unregister
func shmsteerGo_vector_unregister(h C.uint64_t, name *C.char, nameLen C.size_t, version *C.uint64_t) C.int {
	return vectorUnregister(steer.VectorSteer, h, name, nameLen, version)
}

// vectorUnregister deletes a named vector of kind.
func vectorUnregister(kind steer.VectorKind, h C.uint64_t, name *C.char, nameLen C.size_t, version *C.uint64_t) C.int {
	inst, rc := engineOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	sname, ok := cstr(name, nameLen)
	if !ok {
		return badArg("name")
	}
	unreg := inst.eng.Unregister
	if kind == steer.VectorProbe {
		unreg = inst.eng.UnregisterProbe
	}
	v, err := unreg(strings.Clone(sname))
	return versionOut(version, v, err)
}

//export shmsteerGo_global_set_json
func shmsteerGo_global_set_json(h C.uint64_t, js *C.char, jsLen C.size_t, version *C.uint64_t) C.int {
	inst, rc := engineOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	var s steer.Steering
	if err := decodeJSON(js, jsLen, &s); err != nil {
		return fail(err)
	}
	v, err := inst.eng.SetGlobal(s)
	return versionOut(version, v, err)
}

// admissionJSON is the admission JSON of shmsteer_request_admit_json.
type admissionJSON struct {
	Tenant       string          `json:"tenant"`
	Conversation string          `json:"conversation"`
	Override     *steer.Steering `json:"override"`
	// Steering is the fork's declarative gates (steer.DecodeGates), inline sources in the C
	// ABI's vector form (gateUnpack).
	Steering json.RawMessage `json:"steering"`
	// Capture is the request's activation capture, {consumer: spec} (capture.DecodeRequest),
	// and PromptLen its prompt's length in tokens.
	Capture   json.RawMessage `json:"capture"`
	PromptLen int             `json:"prompt_len"`
}

//export shmsteerGo_request_admit_json
func shmsteerGo_request_admit_json(h C.uint64_t, id *C.char, idLen C.size_t, js *C.char, jsLen C.size_t, version *C.uint64_t) C.int {
	ad, rc := admitWith(h, id, idLen, js, jsLen, nil)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	return versionOut(version, ad.Version, nil)
}

//export shmsteerGo_request_admit_result
func shmsteerGo_request_admit_result(h C.uint64_t, id *C.char, idLen C.size_t, js *C.char, jsLen C.size_t, out *C.shmsteer_admitted) C.int {
	ad, rc := admitWith(h, id, idLen, js, jsLen, nil)
	return admittedOut(ad, rc, out)
}

// admittedOut ends an admission: rc, with what it did in *out (nil: nothing) when rc is OK.
func admittedOut(ad steer.Admitted, rc C.int, out *C.shmsteer_admitted) C.int {
	if rc != C.SHMSTEER_OK || out == nil {
		return rc
	}
	*out = C.shmsteer_admitted{version: C.uint64_t(ad.Version), source: C.int32_t(ad.Source)}
	flag := func(b bool) C.uint8_t {
		if b {
			return 1
		}
		return 0
	}
	out.latched, out.refused, out.replaced = flag(ad.Latched), flag(ad.Refused), flag(ad.Replaced)
	for i, b := range ad.Digest {
		out.digest[i] = C.uint8_t(b)
	}
	return C.SHMSTEER_OK
}

// admitWith decodes an admission JSON and admits it: every admission entry's one path
// (shmsteer_request_admit_json, _result and _binary). vectors, when not nil, adds the binary
// entry's inline vectors to the override (made when the JSON has none) before anything is
// validated, so they are validated with the JSON's, in one pass.
func admitWith(h C.uint64_t, id *C.char, idLen C.size_t, js *C.char, jsLen C.size_t, vectors func(*instance, *steer.Steering) C.int) (steer.Admitted, C.int) {
	inst, rc := engineOf(h)
	if rc != C.SHMSTEER_OK {
		return steer.Admitted{}, rc
	}
	sid, ok := cstr(id, idLen)
	if !ok {
		return steer.Admitted{}, badArg("id")
	}
	var a admissionJSON
	if jsLen > 0 {
		if err := decodeJSON(js, jsLen, &a); err != nil {
			return steer.Admitted{}, fail(err)
		}
	}
	if vectors != nil {
		if a.Override == nil {
			a.Override = &steer.Steering{}
		}
		if rc := vectors(inst, a.Override); rc != C.SHMSTEER_OK {
			return steer.Admitted{}, rc
		}
	}
	gates, err := steer.DecodeGates(a.Steering, gateUnpack)
	if err != nil {
		return steer.Admitted{}, fail(err)
	}
	if a.PromptLen < 0 {
		return steer.Admitted{}, badArg(fmt.Sprintf("prompt_len %d is negative", a.PromptLen))
	}
	var caps map[string]json.RawMessage
	if len(a.Capture) > 0 {
		if caps, err = capture.DecodeRequest(a.Capture); err != nil {
			return steer.Admitted{}, fail(err)
		}
	}
	adm := steer.Admission{RequestID: strings.Clone(sid), Conversation: steer.ConvKey{Tenant: a.Tenant, ID: a.Conversation}, Override: a.Override, Gates: gates,
		Capture: caps, PromptLen: a.PromptLen}
	o, err := inst.steerOwner("admission")
	if err != nil {
		return steer.Admitted{}, fail(err)
	}
	ad, err := o.Admit(adm)
	if err != nil {
		return ad, fail(err)
	}
	if inst.hub != nil {
		inst.hub.Begin(adm.RequestID, ad.Capture) // before the admission returns
	}
	return ad, C.SHMSTEER_OK
}

//export shmsteerGo_request_end
func shmsteerGo_request_end(h C.uint64_t, id *C.char, idLen C.size_t, version *C.uint64_t) C.int {
	inst, rc := engineOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	sid, ok := cstr(id, idLen)
	if !ok {
		return badArg("id")
	}
	o, err := inst.steerOwner("a request's end")
	if err != nil {
		return fail(err)
	}
	v, err := o.End(strings.Clone(sid))
	if err == nil && inst.hub != nil {
		inst.hub.End(sid)
	}
	return versionOut(version, v, err)
}
