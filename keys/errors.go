package keys

import (
	"errors"
)

// Sentinel errors. Every error this package returns wraps one of these, one of ipc's (a
// worker's write that could not reach the owner) or one of shm's, so callers test them with
// errors.Is. None of them carries a key.
var (
	// ErrNotFound means no key is registered under the request id (never set, or removed and
	// purged).
	ErrNotFound = errors.New("shmsteer: key not found for request id")
	// ErrRevoked means the request's key was removed and its revoked sentinel still stands
	// (until the grace period ends): the request is over, stop generating for it.
	ErrRevoked = errors.New("shmsteer: key revoked for request id")
	// ErrRequestIDTooLong means a request id is empty or longer than MaxRequestIDLen bytes.
	ErrRequestIDTooLong = errors.New("shmsteer: request id empty or longer than 256 bytes")
	// ErrTooLarge means a key is longer than the owner's MaxKeyBytes (default 4096): send a
	// shorter key, or raise Options.MaxKeyBytes in the owner.
	ErrTooLarge = errors.New("shmsteer: key larger than MaxKeyBytes")
)
