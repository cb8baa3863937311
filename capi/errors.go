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

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
	"github.com/shmsteer/shmsteer/steer/vecfile"
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

// errorCode is one row of the code table: a code of shmsteer.h, the Go name of its sentinel and
// the sentinel.
type errorCode struct {
	code C.int
	name string
	err  error
}

// errorCodes lists every code. Matching walks it in order and the first sentinel errors.Is
// finds wins, so sentinels that wrap or are wrapped by others come before them: ipc's and
// steer's ErrIncompatible before shm's, and ipc.ErrClosed is shm.ErrClosed itself.
var errorCodes = []errorCode{
	{C.SHMSTEER_E_FORKED, "capi.ErrForked", ErrForked},
	{C.SHMSTEER_E_BUFFER_TOO_SMALL, "capi.ErrBufferTooSmall", ErrBufferTooSmall},
	{C.SHMSTEER_E_INVALID_ARGUMENT, "capi.ErrInvalidArgument", ErrInvalidArgument},
	{C.SHMSTEER_E_BAD_HANDLE, "capi.ErrBadHandle", ErrBadHandle},
	{C.SHMSTEER_E_OTHER, "capi.ErrOther", ErrOther},

	// steer.ErrNotServed explains an ipc.ErrUnknownOp from the owner: the specific one first.
	{C.SHMSTEER_E_NOT_SERVED, "steer.ErrNotServed", steer.ErrNotServed},

	{C.SHMSTEER_E_AUTH_SECRET_NOT_DEFINED, "ipc.ErrAuthSecretNotDefined", ipc.ErrAuthSecretNotDefined},
	{C.SHMSTEER_E_NOT_YET_INITIALIZED, "ipc.ErrNotYetInitialized", ipc.ErrNotYetInitialized},
	{C.SHMSTEER_E_PREVIOUSLY_INITIALIZED, "ipc.ErrPreviouslyInitialized", ipc.ErrPreviouslyInitialized},
	{C.SHMSTEER_E_AUTH_FAILED, "ipc.ErrAuthFailed", ipc.ErrAuthFailed},
	{C.SHMSTEER_E_OWNER_GONE, "ipc.ErrOwnerGone", ipc.ErrOwnerGone},
	{C.SHMSTEER_E_TIMEOUT, "ipc.ErrTimeout", ipc.ErrTimeout},
	{C.SHMSTEER_E_INCOMPATIBLE, "ipc.ErrIncompatible", ipc.ErrIncompatible},
	{C.SHMSTEER_E_KEY_NOT_FOUND, "ipc.ErrKeyNotFound", ipc.ErrKeyNotFound},
	{C.SHMSTEER_E_KEY_REVOKED, "ipc.ErrKeyRevoked", ipc.ErrKeyRevoked},
	{C.SHMSTEER_E_REQUEST_ID_TOO_LONG, "ipc.ErrRequestIDTooLong", ipc.ErrRequestIDTooLong},
	{C.SHMSTEER_E_KEY_TOO_LARGE, "ipc.ErrKeyTooLarge", ipc.ErrKeyTooLarge},
	{C.SHMSTEER_E_FRAME_TOO_LARGE, "ipc.ErrFrameTooLarge", ipc.ErrFrameTooLarge},
	{C.SHMSTEER_E_UNKNOWN_OP, "ipc.ErrUnknownOp", ipc.ErrUnknownOp},
	{C.SHMSTEER_E_PROTOCOL, "ipc.ErrProtocol", ipc.ErrProtocol},
	{C.SHMSTEER_E_SECRET_FILE, "ipc.ErrSecretFile", ipc.ErrSecretFile},
	{C.SHMSTEER_E_SECRET_CONFLICT, "ipc.ErrSecretConflict", ipc.ErrSecretConflict},
	{C.SHMSTEER_E_RENDEZVOUS_TAKEN, "ipc.ErrRendezvousTaken", ipc.ErrRendezvousTaken},
	{C.SHMSTEER_E_OWNER_BUSY, "ipc.ErrBusy", ipc.ErrBusy},
	{C.SHMSTEER_E_DEAD_REGION, "ipc.ErrDeadRegion", ipc.ErrDeadRegion},

	{C.SHMSTEER_E_STEER_INCOMPATIBLE, "steer.ErrIncompatible", steer.ErrIncompatible},
	{C.SHMSTEER_E_STEER_BAD_CONFIG, "steer.ErrBadConfig", steer.ErrBadConfig},
	{C.SHMSTEER_E_BAD_NAME, "steer.ErrBadName", steer.ErrBadName},
	{C.SHMSTEER_E_NON_FINITE, "steer.ErrNonFinite", steer.ErrNonFinite},
	{C.SHMSTEER_E_HIDDEN_SIZE, "steer.ErrHiddenSize", steer.ErrHiddenSize},
	{C.SHMSTEER_E_UNKNOWN_HOOK, "steer.ErrUnknownHook", steer.ErrUnknownHook},
	{C.SHMSTEER_E_LAYER_RANGE, "steer.ErrLayerRange", steer.ErrLayerRange},
	{C.SHMSTEER_E_DUPLICATE, "steer.ErrDuplicate", steer.ErrDuplicate},
	{C.SHMSTEER_E_EMPTY_SET, "steer.ErrEmptySet", steer.ErrEmptySet},
	{C.SHMSTEER_E_BAD_CLAMP, "steer.ErrBadClamp", steer.ErrBadClamp},
	{C.SHMSTEER_E_UNKNOWN_VECTOR, "steer.ErrUnknownVector", steer.ErrUnknownVector},
	{C.SHMSTEER_E_BAD_REQUEST_ID, "steer.ErrBadRequestID", steer.ErrBadRequestID},
	{C.SHMSTEER_E_BAD_ENCODING, "steer.ErrBadEncoding", steer.ErrBadEncoding},
	{C.SHMSTEER_E_NOT_OWNER, "steer.ErrNotOwner", steer.ErrNotOwner},
	{C.SHMSTEER_E_NO_STEP, "steer.ErrNoStep", steer.ErrNoStep},
	{C.SHMSTEER_E_BAD_BATCH, "steer.ErrBadBatch", steer.ErrBadBatch},
	{C.SHMSTEER_E_SHAPE, "steer.ErrShape", steer.ErrShape},
	{C.SHMSTEER_E_REMOTE, "steer.ErrRemote", steer.ErrRemote},
	{C.SHMSTEER_E_OVERFLOW, "steer.ErrOverflow", steer.ErrOverflow},
	{C.SHMSTEER_E_UNKNOWN_REQUEST, "steer.ErrUnknownRequest", steer.ErrUnknownRequest},
	{C.SHMSTEER_E_LATCH_STATE, "steer.ErrLatchState", steer.ErrLatchState},
	{C.SHMSTEER_E_PROBE_SITE, "steer.ErrProbeSite", steer.ErrProbeSite},

	// vecfile's errors also wrap steer's where one fits (ErrShape with ErrHiddenSize): steer's
	// code wins, so callers that handle steer's codes keep working.
	{C.SHMSTEER_E_FILE_TOO_LARGE, "vecfile.ErrTooLarge", vecfile.ErrTooLarge},
	{C.SHMSTEER_E_UNKNOWN_FORMAT, "vecfile.ErrUnknownFormat", vecfile.ErrUnknownFormat},
	{C.SHMSTEER_E_FILE_CORRUPT, "vecfile.ErrCorrupt", vecfile.ErrCorrupt},
	{C.SHMSTEER_E_FILE_DTYPE, "vecfile.ErrDtype", vecfile.ErrDtype},
	{C.SHMSTEER_E_FILE_SHAPE, "vecfile.ErrShape", vecfile.ErrShape},
	{C.SHMSTEER_E_VALUE_RANGE, "vecfile.ErrValueRange", vecfile.ErrValueRange},
	{C.SHMSTEER_E_TENSOR_NAME, "vecfile.ErrTensorName", vecfile.ErrTensorName},
	{C.SHMSTEER_E_NEED_LAYERS, "vecfile.ErrNeedLayers", vecfile.ErrNeedLayers},
	{C.SHMSTEER_E_NO_VECTORS, "vecfile.ErrNoVectors", vecfile.ErrNoVectors},
	{C.SHMSTEER_E_UNREPRESENTABLE, "vecfile.ErrUnrepresentable", vecfile.ErrUnrepresentable},
	{C.SHMSTEER_E_FILE_OPTIONS, "vecfile.ErrBadOptions", vecfile.ErrBadOptions},

	{C.SHMSTEER_E_MARKED, "shm.ErrMarked", shm.ErrMarked}, // before ErrNotFound, which it wraps
	{C.SHMSTEER_E_NOT_FOUND, "shm.ErrNotFound", shm.ErrNotFound},
	{C.SHMSTEER_E_REGION_FULL, "shm.ErrRegionFull", shm.ErrRegionFull},
	{C.SHMSTEER_E_SHM_KEY_TOO_LONG, "shm.ErrKeyTooLong", shm.ErrKeyTooLong},
	{C.SHMSTEER_E_BAD_KIND, "shm.ErrBadKind", shm.ErrBadKind},
	{C.SHMSTEER_E_SHM_BAD_CONFIG, "shm.ErrBadConfig", shm.ErrBadConfig},
	{C.SHMSTEER_E_NOT_REGION, "shm.ErrNotRegion", shm.ErrNotRegion},
	{C.SHMSTEER_E_SHM_INCOMPATIBLE, "shm.ErrIncompatible", shm.ErrIncompatible},
	{C.SHMSTEER_E_CORRUPT, "shm.ErrCorrupt", shm.ErrCorrupt},
	{C.SHMSTEER_E_READ_ONLY, "shm.ErrReadOnly", shm.ErrReadOnly},
	{C.SHMSTEER_E_BUSY, "shm.ErrBusy", shm.ErrBusy},
	{C.SHMSTEER_E_READER_BUSY, "shm.ErrReaderBusy", shm.ErrReaderBusy},
	{C.SHMSTEER_E_CLOSED, "shm.ErrClosed", shm.ErrClosed},
	{C.SHMSTEER_E_NO_READER_SLOT, "shm.ErrNoReaderSlot", shm.ErrNoReaderSlot},
	{C.SHMSTEER_E_SNAPSHOT_TOO_OLD, "shm.ErrSnapshotTooOld", shm.ErrSnapshotTooOld},
	{C.SHMSTEER_E_SNAPSHOT_FUTURE, "shm.ErrSnapshotFuture", shm.ErrSnapshotFuture},
	{C.SHMSTEER_E_VALUE_TOO_LARGE, "shm.ErrValueTooLarge", shm.ErrValueTooLarge},
	{C.SHMSTEER_E_UNSUPPORTED, "shm.ErrUnsupported", shm.ErrUnsupported},
	{C.SHMSTEER_E_LEASE_UNAVAILABLE, "shm.ErrLeaseUnavailable", shm.ErrLeaseUnavailable},
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
