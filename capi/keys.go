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
	"sync"
	"unsafe"

	"github.com/shmsteer/shmsteer/keys"
	"github.com/shmsteer/shmsteer/shm"
)

type reader struct {
	kr   *keys.Reader
	inst *instance // whose readers it is among (readerSet)
}

// readerSet is an instance's readers not yet closed. shmsteer_close (and a follower's close, for
// its clients) closes those left open with the instance (closeAll): their handles are freed,
// so later calls through them answer BAD_HANDLE from the handle table and the C reader, which
// no longer knows them, and never read the unmapped region; a handle of a reader opened later
// in the same slot has another generation.
type readerSet struct {
	mu     sync.Mutex
	closed bool
	open   map[uint64]*reader
}

// add records r as handle h's and hands its descriptor to the C reader, under mu so that closeAll
// cannot run between the two; false when the instance closed meanwhile (r is not recorded).
func (s *readerSet) add(h uint64, r *reader) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.open == nil {
		s.open = map[uint64]*reader{}
	}
	s.open[h] = r
	fastRegister(h, r.kr.Descriptor())
	return true
}

func (s *readerSet) forget(h uint64) {
	s.mu.Lock()
	delete(s.open, h)
	s.mu.Unlock()
}

// closeAll closes the readers left open, before their region closes: each one whose handle is
// still live (shmsteer_reader_close did not get there first) is withdrawn from the table and the
// C reader and closed.
func (s *readerSet) closeAll() {
	s.mu.Lock()
	open := s.open
	s.open, s.closed = nil, true
	s.mu.Unlock()
	for h, r := range open {
		if handles.remove(h) {
			fastUnregister(h)
			r.kr.Close()
		}
	}
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
	r := &reader{kr: kr, inst: inst}
	if rc := store(r, out); rc != C.SHMSTEER_OK {
		kr.Close()
		return rc
	}
	if !inst.readers.add(uint64(*out), r) { // shmsteer_close ran meanwhile
		handles.remove(uint64(*out))
		kr.Close()
		*out = 0
		return fail(fmt.Errorf("%w: the shmsteer_t closed while the reader opened", shm.ErrClosed))
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_reader_key_get
func shmsteerGo_reader_key_get(h C.uint64_t, id *C.char, idLen C.size_t, buf unsafe.Pointer, capacity C.size_t, n *C.size_t) C.int {
	r, ok := getAs[*reader](uint64(h))
	if !ok {
		return badHandle("not a live shmsteer_reader_t (closed, or closed with its shmsteer_t)")
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
		return badHandle("shmsteer_reader_close: not a live shmsteer_reader_t (closed, or closed with its shmsteer_t)")
	}
	if r.inst != nil { // nil only for the tests' own readers
		r.inst.readers.forget(uint64(h))
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
