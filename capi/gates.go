package main

/*
#include <stdlib.h>
#include "shmsteer.h"
*/
import "C"

import (
	"bytes"
	"encoding/json"
	"fmt"
	"unsafe"

	"github.com/shmsteer/shmsteer/steer"
	"github.com/shmsteer/shmsteer/steer/vecfile"
)

// gateUnpack reads an inline gate source's vectors of one hook: the fork's packed blob
// (SteeringHookPacked, {dtype, shape, layer_indices, data, scales?}: vecfile.Packed), or the C
// ABI's vector form, a list of {"layer": n, "scale": s, "data": [floats]} ("hook", when given,
// must be the key).
func gateUnpack(hook string, raw json.RawMessage) ([]steer.Vector, error) {
	if t := bytes.TrimSpace(raw); len(t) > 0 && t[0] == '{' {
		vs, err := vecfile.UnpackHook(hook, t)
		if err != nil {
			return nil, fmt.Errorf("%w: inline vectors of hook %q: %w", steer.ErrBadGate, hook, err)
		}
		return vs, nil
	}
	var vs []steer.Vector
	if err := decodeJSONString(string(raw), &vs); err != nil {
		return nil, fmt.Errorf("%w: inline vectors of hook %q: want a packed blob or a list of {layer, scale, data}", steer.ErrBadGate, hook)
	}
	for i := range vs {
		if vs[i].Hook != "" && vs[i].Hook != hook {
			return nil, fmt.Errorf("%w: an inline vector of hook %q names hook %q", steer.ErrBadGate, hook, vs[i].Hook)
		}
		vs[i].Hook = hook
	}
	return vs, nil
}

// checkGates is the admission's reading of its "steering" value, without an engine: the JSON
// decoded as admitWith decodes the admission's (ErrInvalidArgument for text that is not one
// JSON value), then steer.DecodeGates with the admission's unpacker (gateUnpack). It returns the
// number of gates; what it refuses, an admission of the same value refuses with the same error.
func checkGates(js string) (int, error) {
	gates, err := decodeGatesJSON(js)
	return len(gates), err
}

// decodeGatesJSON decodes an admission's "steering" value as admitWith does.
func decodeGatesJSON(js string) ([]steer.Gate, error) {
	var raw json.RawMessage
	if js != "" {
		if err := decodeJSONString(js, &raw); err != nil {
			return nil, err
		}
	}
	return steer.DecodeGates(raw, gateUnpack)
}

// checkGatesAt is checkGates plus what an admission checks against the vectors registered at
// snapshot sn and its model (steer.Engine.CheckGatesAt); id, when not empty, names the request
// in the errors as an admission of that id does.
func checkGatesAt(sn *snapshot, id, js string) (int, error) {
	if sn.inst.eng == nil {
		return 0, fmt.Errorf("the region records no steering model: %w", sn.inst.engErr)
	}
	gates, err := decodeGatesJSON(js)
	if err != nil {
		return 0, err
	}
	set := ""
	if id != "" {
		set = fmt.Sprintf("request %q", id)
	}
	if err := sn.inst.eng.CheckGatesAt(&sn.snap, gates, set); err != nil {
		return 0, err
	}
	return len(gates), nil
}

//export shmsteerGo_gates_check
func shmsteerGo_gates_check(js *C.char, jsLen C.size_t, n *C.size_t) C.int {
	s, ok := cstr(js, jsLen)
	if !ok {
		return badArg("json pointer or length")
	}
	count, err := checkGates(s)
	if err != nil {
		return fail(err)
	}
	if n != nil {
		*n = C.size_t(count)
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_gates_check_at
func shmsteerGo_gates_check_at(h C.uint64_t, id *C.char, idLen C.size_t, js *C.char, jsLen C.size_t, n *C.size_t) C.int {
	sn, ok := getAs[*snapshot](uint64(h))
	if !ok {
		return badHandle("not a live shmsteer_snapshot_t")
	}
	rid, ok := cstr(id, idLen)
	if !ok {
		return badArg("id pointer or length")
	}
	s, ok := cstr(js, jsLen)
	if !ok {
		return badArg("json pointer or length")
	}
	count, err := checkGatesAt(sn, rid, s)
	if err != nil {
		return fail(err)
	}
	if n != nil {
		*n = C.size_t(count)
	}
	return C.SHMSTEER_OK
}

// callGatesCheck calls shmsteer_gates_check through its C wrapper, as a C caller does (for the
// tests, which cannot use cgo): the status, the gate count and shmsteer_last_error().
func callGatesCheck(js string, withCount bool) (rc int, count int, msg string) {
	p := C.CString(js)
	defer C.free(unsafe.Pointer(p))
	var n C.size_t = 12345
	np := &n
	if !withCount {
		np = nil
	}
	rc = int(C.shmsteer_gates_check(p, C.size_t(len(js)), np))
	return rc, int(n), C.GoString(C.shmsteer_last_error())
}
