package main

/*
#include <stdint.h>
#include <stdlib.h>
#include "shmsteer.h"
*/
import "C"

import (
	"math"
	"unsafe"
)

// The batched key get: one crossing into the engine for a batch of ids, each item answered as
// shmsteer_reader_key_get answers it alone (its Go side, shmsteerGo_reader_key_get, is the
// same three steps: getArgs, keys.Reader.Get, finishGet).

//export shmsteerGo_reader_key_get_many
func shmsteerGo_reader_key_get_many(h C.uint64_t, items *C.shmsteer_key_get_item, n C.size_t) C.int {
	r, ok := getAs[*reader](uint64(h))
	if !ok {
		return badHandle("not a live shmsteer_reader_t")
	}
	if n == 0 {
		return C.SHMSTEER_OK
	}
	if items == nil || uint64(n) > math.MaxInt32 {
		return badArg("items must not be NULL, and n at most 2^31-1")
	}
	batch := unsafe.Slice(items, int(n))
	for i := range batch {
		it := &batch[i]
		sid, dst, ok := getArgs(it.id, it.id_len, it.buf, it.cap, &it.len)
		if !ok {
			it.rc = badArg("id, buf or cap of an item")
			continue
		}
		out, err := r.kr.Get(sid, dst)
		it.rc = finishGet(out, err, it.buf, it.cap, &it.len)
	}
	return C.SHMSTEER_OK
}
