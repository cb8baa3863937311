package main

// Binary admission (shmsteer_request_admit_binary, shmsteer_request_admit_buffers): an
// override's inline vectors, and its clamps' directions, passed as the caller's float32
// buffers, not as JSON float lists. A 32-layer × 4096 override is 512 KiB of
// floats; as JSON it is ~2.7 MB of text to print and parse.

/*
#include <stdint.h>
#include <stdlib.h>
#include "shmsteer.h"
*/
import "C"

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/shmsteer/shmsteer/steer"
)

//export shmsteerGo_request_admit_binary
func shmsteerGo_request_admit_binary(h C.uint64_t, id *C.char, idLen C.size_t, js *C.char, jsLen C.size_t,
	vectors *C.shmsteer_admit_vector, n C.size_t, out *C.shmsteer_admitted) C.int {
	add := func(inst *instance, s *steer.Steering) C.int { return addBinaryVectors(inst, s, vectors, n) }
	ad, rc := admitWith(h, id, idLen, js, jsLen, add)
	return admittedOut(ad, rc, out)
}

//export shmsteerGo_request_admit_buffers
func shmsteerGo_request_admit_buffers(h C.uint64_t, id *C.char, idLen C.size_t, js *C.char, jsLen C.size_t,
	vectors *C.shmsteer_admit_vector, n C.size_t, clamps *C.shmsteer_admit_clamp, nc C.size_t, out *C.shmsteer_admitted) C.int {
	add := func(inst *instance, s *steer.Steering) C.int {
		if rc := addBinaryVectors(inst, s, vectors, n); rc != C.SHMSTEER_OK {
			return rc
		}
		return addBinaryClamps(inst, s, clamps, nc)
	}
	ad, rc := admitWith(h, id, idLen, js, jsLen, add)
	return admittedOut(ad, rc, out)
}

// addBinaryClamps appends clamps[0:n] to the tiers of s, after the clamps the JSON gave, in
// order. As addBinaryVectors: every pointer, length, tier and hook is checked before a float is
// read, and the directions are copied once into one Go block; the rest (layer, finite values,
// min <= max, the direction's norm, the strength's range) is the engine's check of every clamp.
func addBinaryClamps(inst *instance, s *steer.Steering, clamps *C.shmsteer_admit_clamp, n C.size_t) C.int {
	if n == 0 {
		return C.SHMSTEER_OK
	}
	if clamps == nil || uint64(n) > math.MaxInt32 {
		return badArg(fmt.Sprintf("clamps (NULL or n_clamps %d)", uint64(n)))
	}
	in := unsafe.Slice(clamps, int(n))
	hidden := inst.cfg.Hidden
	for i := range in {
		c := &in[i]
		if rc := checkBuffer(inst, "clamp", "dir", i, c.tier, c.hook, c.dir == nil, c.len); rc != C.SHMSTEER_OK {
			return rc
		}
	}
	dirs := make([]float32, len(in)*hidden)
	for i := range in {
		c := &in[i]
		dir := dirs[i*hidden : (i+1)*hidden : (i+1)*hidden]
		copy(dir, unsafe.Slice((*float32)(unsafe.Pointer(c.dir)), hidden))
		t := s.Tier(steer.Phase(c.tier))
		t.Clamps = append(t.Clamps, steer.Clamp{Hook: inst.cfg.HookName(steer.HookID(c.hook)), Layer: int(c.layer),
			Dir: dir, Min: float32(c.min), Max: float32(c.max), Strength: float32(c.strength)})
	}
	return C.SHMSTEER_OK
}

// addBinaryVectors appends vectors[0:n] to the tiers of s. Every pointer, length, tier and hook
// is checked before any float is read; the floats are then copied once, into one Go block, so
// that what is validated is what is stored even if the caller's buffers change meanwhile (a
// Python thread may run while the call is in Go).
func addBinaryVectors(inst *instance, s *steer.Steering, vectors *C.shmsteer_admit_vector, n C.size_t) C.int {
	if n == 0 {
		return C.SHMSTEER_OK
	}
	if vectors == nil || uint64(n) > math.MaxInt32 {
		return badArg(fmt.Sprintf("vectors (NULL or n_vectors %d)", uint64(n)))
	}
	in := unsafe.Slice(vectors, int(n))
	hidden := inst.cfg.Hidden
	for i := range in {
		e := &in[i]
		if rc := checkBuffer(inst, "vector", "data", i, e.tier, e.hook, e.data == nil, e.len); rc != C.SHMSTEER_OK {
			return rc
		}
	}
	floats := make([]float32, len(in)*hidden)
	for i := range in {
		e := &in[i]
		data := floats[i*hidden : (i+1)*hidden : (i+1)*hidden]
		copy(data, unsafe.Slice((*float32)(unsafe.Pointer(e.data)), hidden))
		t := s.Tier(steer.Phase(e.tier)) // SHMSTEER_TIER_* are steer's phases: base 0, prefill 1, decode 2
		t.Vectors = append(t.Vectors, steer.Vector{Hook: inst.cfg.HookName(steer.HookID(e.hook)), Layer: int(e.layer), Scale: float32(e.scale), Data: data})
	}
	return C.SHMSTEER_OK
}

// checkBuffer checks what a buffer record (a vector's or a clamp's) holds besides its floats,
// before any float is read: its tier, its hook (an id beyond 16 bits is no hook, not its low
// 16 bits' one), its pointer and its length, the hidden size.
func checkBuffer(inst *instance, what, field string, i int, tier, hook C.uint32_t, null bool, n C.size_t) C.int {
	if tier > C.SHMSTEER_TIER_DECODE {
		return badArg(fmt.Sprintf("%s %d: tier %d (SHMSTEER_TIER_BASE, _PREFILL or _DECODE)", what, i, uint32(tier)))
	}
	if hook > math.MaxUint16 || inst.cfg.HookName(steer.HookID(hook)) == "" {
		return fail(fmt.Errorf("%w: hook id %d in %s %d", steer.ErrUnknownHook, uint32(hook), what, i))
	}
	if null && n > 0 {
		return badArg(fmt.Sprintf("%s %d: NULL %s with len %d", what, i, field, uint64(n)))
	}
	if hidden := inst.cfg.Hidden; uint64(n) != uint64(hidden) {
		return fail(fmt.Errorf("%w: %s %d has %d floats, hidden size is %d", steer.ErrHiddenSize, what, i, uint64(n), hidden))
	}
	return C.SHMSTEER_OK
}
