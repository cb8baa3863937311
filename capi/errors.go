package main

/*
#include <string.h>
#include "shmsteer.h"
char *capi_errbuf(void);
*/
import "C"

import (
	"errors"
	"unsafe"
)

// Errors of the C ABI itself (codes 1..9); every other code is a sentinel of shm, ipc, steer or
// steer/vecfile.
var (
	// ErrForked is returned by every call in a child process forked after the library was
	// loaded (checked in C; this value only names the code). Start workers with spawn.
	ErrForked = errors.New("shmsteer: called in a process forked after libshmsteer was loaded; the Go runtime does not survive fork: start workers with the spawn start method (fork+exec) and load the library there")
	// ErrBufferTooSmall means an output buffer is too small; the call reports the size needed.
	ErrBufferTooSmall = errors.New("shmsteer: buffer too small: retry with the size reported in *len")
	// ErrInvalidArgument means a NULL pointer where one is required, a size out of range,
	// malformed JSON or an unknown phase.
	ErrInvalidArgument = errors.New("shmsteer: invalid argument")
	// ErrBadHandle means a handle that is NULL, already closed, or of another type.
	ErrBadHandle = errors.New("shmsteer: bad handle: NULL, already closed, or of another type")
	// ErrOther means an error that wraps none of the sentinels (an I/O error reading a secret
	// file, say); the message says what failed.
	ErrOther = errors.New("shmsteer: error")
)

// errorCode is one row of the code table (errorCodes, generated from errors.tab into
// errors_gen.go): a code of shmsteer.h, the Go name of its sentinel and the sentinel.
type errorCode struct {
	code C.int
	name string
	err  error
}

// codeOf finds err's code; SHMSTEER_E_OTHER when it wraps no known sentinel.
func codeOf(err error) C.int {
	for _, c := range errorCodes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return C.SHMSTEER_E_OTHER
}

// fail records err's message in the calling thread's error buffer (a cgo callback runs on the
// thread that called it, so the C thread-local is the caller's) and returns its code.
func fail(err error) C.int {
	setMessage(err.Error())
	return codeOf(err)
}

// failCode is fail for the ABI's own errors, with context.
func failCode(base error, context string) C.int {
	if context != "" {
		setMessage(base.Error() + ": " + context)
	} else {
		setMessage(base.Error())
	}
	return codeOf(base)
}

func setMessage(msg string) {
	buf := unsafe.Slice((*byte)(unsafe.Pointer(C.capi_errbuf())), C.SHMSTEER_ERRMSG_MAX)
	n := copy(buf[:len(buf)-1], msg)
	buf[n] = 0
}

// errorCodeLimit is SHMSTEER_E_LIMIT, one past the largest code (for the tests).
const errorCodeLimit = int(C.SHMSTEER_E_LIMIT)

// errorNameOf is the Go name of code (tests compare it with the C table).
func errorNameOf(code int) string {
	for _, c := range errorCodes {
		if int(c.code) == code {
			return c.name
		}
	}
	return ""
}

// cErrorName calls the C table shmsteer_error_name (for the tests, which cannot use cgo).
func cErrorName(code int) string {
	p := C.shmsteer_error_name(C.int(code))
	if p == nil {
		return ""
	}
	return C.GoString(p)
}
