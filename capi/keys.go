package main

// The key registry through a shmsteer_t, and shmsteer_reader_t.

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

	"github.com/shmsteer/shmsteer/keys"
)

type reader struct {
	kr *keys.Reader
}

// finishGet turns a Get into (buf, capacity) into the ABI's result. A key that did not fit was
// appended to a fresh Go buffer instead: copy it if it fits after all, and wipe it either way.
func finishGet(out []byte, err error, buf unsafe.Pointer, capacity C.size_t, n *C.size_t) C.int {
	if err != nil {
		return fail(err)
	}
	if len(out) > 0 && unsafe.Pointer(&out[0]) != buf {
		defer clear(out)
		*n = C.size_t(len(out))
		if uint64(len(out)) > uint64(capacity) {
			return failCode(ErrBufferTooSmall, fmt.Sprintf("the key has %d bytes, the buffer %d", len(out), capacity))
		}
		copy(unsafe.Slice((*byte)(buf), len(out)), out)
		return C.SHMSTEER_OK
	}
	*n = C.size_t(len(out))
	return C.SHMSTEER_OK
}

func getArgs(id *C.char, idLen C.size_t, buf unsafe.Pointer, capacity C.size_t, n *C.size_t) (string, []byte, bool) {
	sid, ok := cstr(id, idLen)
	if !ok || n == nil || (buf == nil && capacity > 0) || uint64(capacity) > math.MaxInt32 {
		return "", nil, false
	}
	var dst []byte
	if buf != nil {
		dst = unsafe.Slice((*byte)(buf), int(capacity))[:0]
	}
	return sid, dst, true
}

//export shmsteerGo_key_get
func shmsteerGo_key_get(h C.uint64_t, id *C.char, idLen C.size_t, buf unsafe.Pointer, capacity C.size_t, n *C.size_t) C.int {
	inst, ok := getAs[*instance](uint64(h))
	if !ok {
		return badHandle("not a live shmsteer_t")
	}
	if inst.keys == nil {
		return fail(inst.keysErr)
	}
	sid, dst, ok := getArgs(id, idLen, buf, capacity, n)
	if !ok {
		return badArg("id, buf, cap or len")
	}
	out, err := inst.keys.Get(sid, dst)
	return finishGet(out, err, buf, capacity, n)
}

//export shmsteerGo_key_set
func shmsteerGo_key_set(h C.uint64_t, id *C.char, idLen C.size_t, key unsafe.Pointer, keyLen C.size_t) C.int {
	inst, rc := registryOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	sid, ok := cstr(id, idLen)
	kb, ok2 := cbytes(key, keyLen)
	if !ok || !ok2 {
		return badArg("id or key")
	}
	if err := inst.keys.Set(strings.Clone(sid), kb); err != nil {
		return fail(err)
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_key_remove
func shmsteerGo_key_remove(h C.uint64_t, id *C.char, idLen C.size_t) C.int {
	inst, rc := registryOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	sid, ok := cstr(id, idLen)
	if !ok {
		return badArg("id")
	}
	// The owner's purge schedule keeps the id: give it a copy, not a view of C memory.
	if err := inst.keys.Remove(strings.Clone(sid)); err != nil {
		return fail(err)
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_key_list_json
func shmsteerGo_key_list_json(h C.uint64_t, buf *C.char, capacity C.size_t, n *C.size_t) C.int {
	inst, rc := registryOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	type entry struct {
		ID      string `json:"id"`
		Revoked bool   `json:"revoked"`
	}
	list := []entry{}
	if err := inst.keys.Range(func(id string, revoked bool) bool {
		list = append(list, entry{id, revoked})
		return true
	}); err != nil {
		return fail(err)
	}
	b, err := json.Marshal(list)
	if err != nil {
		return fail(err)
	}
	return writeOut(b, buf, capacity, n)
}

//export shmsteerGo_reader_open
func shmsteerGo_reader_open(h C.uint64_t, out *C.uint64_t) C.int {
	inst, rc := registryOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	if out == nil {
		return badArg("out must not be NULL")
	}
	kr, err := inst.keys.NewReader()
	if err != nil {
		return fail(err)
	}
	if rc := store(&reader{kr: kr}, out); rc != C.SHMSTEER_OK {
		kr.Close()
		return rc
	}
	fastRegister(uint64(*out), kr.Descriptor())
	return C.SHMSTEER_OK
}

//export shmsteerGo_reader_key_get
func shmsteerGo_reader_key_get(h C.uint64_t, id *C.char, idLen C.size_t, buf unsafe.Pointer, capacity C.size_t, n *C.size_t) C.int {
	r, ok := getAs[*reader](uint64(h))
	if !ok {
		return badHandle("not a live shmsteer_reader_t")
	}
	sid, dst, ok := getArgs(id, idLen, buf, capacity, n)
	if !ok {
		return badArg("id, buf, cap or len")
	}
	out, err := r.kr.Get(sid, dst)
	return finishGet(out, err, buf, capacity, n)
}

//export shmsteerGo_reader_close
func shmsteerGo_reader_close(h C.uint64_t) C.int {
	r, ok := getAs[*reader](uint64(h))
	if !ok || !handles.remove(uint64(h)) {
		return badHandle("shmsteer_reader_close")
	}
	fastUnregister(uint64(h))
	if err := r.kr.Close(); err != nil {
		return fail(err)
	}
	return C.SHMSTEER_OK
}

// registryOf is the instance of h with its key registry, or the reason it has none (an owner
// that never called keys.Open).
func registryOf(h C.uint64_t) (*instance, C.int) {
	inst, rc := instanceOf(h)
	if rc != C.SHMSTEER_OK {
		return nil, rc
	}
	if inst.keys == nil {
		return nil, fail(inst.keysErr)
	}
	return inst, C.SHMSTEER_OK
}
