package main

// The C ABI's exported functions, one file per handle type: instance.go (shmsteer_t: attach,
// owner start, close, model, status), keys.go (keys and shmsteer_reader_t), snapshot.go
// (shmsteer_snapshot_t and the vector views), steering.go (steering writes through a
// shmsteer_t), stepper.go (shmsteer_stepper_t), batch.go (the per-step batch) and vecfile.go
// (vector files). This file holds the argument and result helpers they share.

/*
#include <stdint.h>
#include <stdlib.h>
#include "shmsteer.h"
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"unsafe"
)

// cstr views (p, n) as a string without copying; valid only during the call, for callees that
// do not keep it.
func cstr(p *C.char, n C.size_t) (string, bool) {
	if n == 0 {
		return "", true
	}
	if p == nil || uint64(n) > math.MaxInt32 {
		return "", false
	}
	return unsafe.String((*byte)(unsafe.Pointer(p)), int(n)), true
}

func cbytes(p unsafe.Pointer, n C.size_t) ([]byte, bool) {
	if n == 0 {
		return nil, true
	}
	if p == nil || uint64(n) > math.MaxInt32 {
		return nil, false
	}
	return unsafe.Slice((*byte)(p), int(n)), true
}

func badArg(what string) C.int { return failCode(ErrInvalidArgument, what) }

func badHandle(what string) C.int { return failCode(ErrBadHandle, what) }

func goString(p *C.char) string {
	if p == nil {
		return ""
	}
	return C.GoString(p)
}

func store(v any, out *C.uint64_t) C.int {
	h := handles.put(v)
	if h == 0 {
		return failCode(ErrOther, fmt.Sprintf("more than %d shmsteer objects alive in this process", maxHandles))
	}
	*out = C.uint64_t(h)
	return C.SHMSTEER_OK
}

// writeOut copies b to (buf, capacity) and sets *n, or reports the size needed.
func writeOut(b []byte, buf *C.char, capacity C.size_t, n *C.size_t) C.int {
	if n == nil || (buf == nil && capacity > 0) {
		return badArg("len must not be NULL, nor buf with cap > 0")
	}
	*n = C.size_t(len(b))
	if uint64(len(b)) > uint64(capacity) {
		return failCode(ErrBufferTooSmall, fmt.Sprintf("%d bytes needed, %d given", len(b), capacity))
	}
	if len(b) > 0 {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(buf)), len(b)), b)
	}
	return C.SHMSTEER_OK
}

func decodeJSON(p *C.char, n C.size_t, v any) error {
	s, ok := cstr(p, n)
	if !ok {
		return fmt.Errorf("%w: json pointer or length", ErrInvalidArgument)
	}
	return decodeJSONString(s, v)
}

// decodeJSONString decodes exactly one JSON value into v, refusing unknown fields.
func decodeJSONString(s string, v any) error {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: JSON: %v", ErrInvalidArgument, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: JSON: trailing data", ErrInvalidArgument)
	}
	return nil
}

// versionOut ends a call that returns a region version: the error's code, or OK with *version
// set (when version is not NULL).
func versionOut(version *C.uint64_t, v uint64, err error) C.int {
	if err != nil {
		return fail(err)
	}
	if version != nil {
		*version = C.uint64_t(v)
	}
	return C.SHMSTEER_OK
}
