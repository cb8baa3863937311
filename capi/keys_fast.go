package main

/*
#include <stdint.h>
#include <stddef.h>
void capi_fast_register(uint64_t h, uintptr_t desc, uint16_t kind, unsigned char live);
void capi_fast_unregister(uint64_t h);
int capi_fast_get(uint64_t h, const char *id, size_t id_len, void *buf, size_t cap, size_t *len);
int capi_fast_find_desc(uintptr_t desc, uint16_t kind, const void *key, size_t klen, uint64_t *off, uint64_t *vlen);
uint64_t capi_fast_hash(uintptr_t desc, uint16_t kind, const void *key, size_t klen);
*/
import "C"

import (
	"unsafe"

	"github.com/shmsteer/shmsteer/internal/proto"
)

// fastRegister hands reader handle h's shm.Reader descriptor to the C reader (keys_fast.c), so
// that gets through h are answered in C when they can be. desc 0 (no descriptor) registers
// nothing: every get then goes to Go.
func fastRegister(h uint64, desc uintptr) {
	if desc != 0 {
		C.capi_fast_register(C.uint64_t(h), C.uintptr_t(desc), C.uint16_t(proto.KindKey), C.uchar(proto.KeyStateLive))
	}
}

// fastUnregister withdraws h from the C reader; called before the reader closes.
func fastUnregister(h uint64) { C.capi_fast_unregister(C.uint64_t(h)) }

// fastGet is the C reader's key get through reader handle h (what shmsteer_reader_key_get
// tries first), for the tests: the key's length in buf and true, or false when Go must answer.
func fastGet(h uint64, id string, buf []byte) (int, bool) {
	var n C.size_t
	var p unsafe.Pointer
	if len(buf) > 0 {
		p = unsafe.Pointer(&buf[0])
	}
	ok := C.capi_fast_get(C.uint64_t(h), (*C.char)(unsafe.Pointer(unsafe.StringData(id))), C.size_t(len(id)), p, C.size_t(len(buf)), &n)
	return int(n), ok != 0
}

// fastFind runs the C reader on a descriptor at address desc (memory outside the Go heap), for
// the fuzz target: the value's offset in the arena and its length, or ok false.
func fastFind(desc uintptr, kind uint16, key []byte) (off, n uint64, ok bool) {
	var o, l C.uint64_t
	var p unsafe.Pointer
	if len(key) > 0 {
		p = unsafe.Pointer(&key[0])
	}
	r := C.capi_fast_find_desc(C.uintptr_t(desc), C.uint16_t(kind), p, C.size_t(len(key)), &o, &l)
	return uint64(o), uint64(l), r != 0
}

// fastHash is the C reader's index hash of (kind, key) with the salt of the descriptor at
// address desc, for the fuzz targets.
func fastHash(desc uintptr, kind uint16, key []byte) uint64 {
	var p unsafe.Pointer
	if len(key) > 0 {
		p = unsafe.Pointer(&key[0])
	}
	return uint64(C.capi_fast_hash(C.uintptr_t(desc), C.uint16_t(kind), p, C.size_t(len(key))))
}
