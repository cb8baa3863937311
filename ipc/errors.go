package ipc

import (
	"errors"
	"fmt"

	"github.com/shmsteer/shmsteer/internal/proto"
	"github.com/shmsteer/shmsteer/shm"
)

// Sentinel errors. Every error this package returns wraps one of these (or one of shm's), so
// callers test them with errors.Is. None of them ever carries the secret.
var (
	// ErrAuthSecretNotDefined means no secret was given: SHMSTEER_SECRET and
	// SHMSTEER_SECRET_FILE are unset, or the value or file is empty. Set one of them (the same
	// secret in the owner and in every worker), or pass the secret explicitly.
	ErrAuthSecretNotDefined = errors.New("shmsteer: auth secret not defined: set SHMSTEER_SECRET_FILE or SHMSTEER_SECRET (the same secret in the owner and every worker) or pass a Secret")
	// ErrSecretFile means the secret file (OwnerOptions.SecretFile, ClientOptions.SecretFile or
	// SHMSTEER_SECRET_FILE) cannot be used: it cannot be read, is not a file, or holds more
	// than MaxSecretFileBytes. The error names the path, never the content.
	ErrSecretFile = errors.New("shmsteer: secret file unusable: check the path, its permissions for this process's user, and its size")
	// ErrSecretConflict means the secret is given twice: both SHMSTEER_SECRET and
	// SHMSTEER_SECRET_FILE, or both the Secret and the SecretFile option. Give exactly one.
	ErrSecretConflict = errors.New("shmsteer: the secret is given twice: set exactly one of SHMSTEER_SECRET and SHMSTEER_SECRET_FILE (or of the Secret and SecretFile options)")
	// ErrNotYetInitialized means no owner answers the handle derived from the secret and
	// namespace: start the owner first, and check that the secret and namespace match it.
	ErrNotYetInitialized = errors.New("shmsteer: not yet initialized: no owner answers for this secret and namespace; start the owner first and check SHMSTEER_SECRET and the namespace")
	// ErrPreviouslyInitialized means an owner already runs for this secret and namespace, in
	// this process or another. Use one owner per handle, or give this one another namespace.
	ErrPreviouslyInitialized = errors.New("shmsteer: previously initialized: an owner already runs for this secret and namespace; attach as a client or use another namespace")
	// ErrRendezvousTaken means every candidate name of the attach handle or of the lobby is
	// held by processes of other uids (abstract socket names have no permissions) and not even
	// a fresh name could be bound, so the owner cannot start. The error names the holders
	// (uid, pid): stop them, or use another namespace.
	ErrRendezvousTaken = errors.New("shmsteer: every rendezvous name for this namespace is held by other users' processes: stop them (uid and pid follow) or use another namespace")
	// ErrAuthFailed means the mutual handshake failed: the peer does not know the secret, it
	// replayed an old handshake, or its uid is not allowed. Check that every process uses the
	// same secret and runs as an allowed user.
	ErrAuthFailed = errors.New("shmsteer: authentication failed: the peer does not prove the same secret or its uid is not allowed")
	// ErrOwnerGone means the owner process exited or closed after this client attached (reads
	// still see the last state; writes cannot be served), or closed the connection during the
	// attach handshake without saying why. Restart the owner and re-attach.
	ErrOwnerGone = errors.New("shmsteer: owner gone: the owner process exited; reads see the last state, writes need a new owner and a new attach")
	// ErrTimeout means the owner did not answer an RPC (or the attach) within the timeout; it
	// may be overloaded or stopped. The request may still have been applied.
	ErrTimeout = errors.New("shmsteer: timed out waiting for the owner")
	// ErrIncompatible means the owner and this process speak different protocol or region
	// layout versions; run the same shmsteer build everywhere. errors.Is also matches
	// shm.ErrIncompatible.
	ErrIncompatible error = &wrapped{
		msg:  "shmsteer: incompatible owner and client: run the same shmsteer version in every process",
		base: shm.ErrIncompatible,
	}
	// ErrFrameTooLarge means an RPC request or reply exceeds the owner's maximum frame size;
	// raise OwnerOptions.MaxFrameBytes or send less.
	ErrFrameTooLarge = errors.New("shmsteer: RPC frame too large")
	// ErrBusy means the owner dropped a connection whose frame found no room in the buffer
	// all connections share (OwnerOptions.MaxBufferedBytes) within OwnerOptions.FrameTimeout,
	// or whose frame did not arrive whole within FrameTimeout. Retry, send smaller frames, or
	// raise those settings in the owner.
	ErrBusy = errors.New("shmsteer: owner busy: no room to buffer the frame in time (OwnerOptions.MaxBufferedBytes, FrameTimeout); retry or send smaller frames")
	// ErrUnknownOp means the owner has no handler for an RPC op (ops below 256 are reserved
	// for this package): register it with Owner.Handle in the owner.
	ErrUnknownOp = proto.ErrUnknownOp
	// ErrProtocol means a peer sent a malformed frame; the connection is dropped.
	ErrProtocol = errors.New("shmsteer: malformed RPC frame")
	// ErrClosed means the Owner or Client was closed.
	ErrClosed = shm.ErrClosed
)

// wrapped is a sentinel that also matches a sentinel of another package.
type wrapped struct {
	msg  string
	base error
}

func (w *wrapped) Error() string { return w.msg }
func (w *wrapped) Unwrap() error { return w.base }

// Error codes on the wire: proto's table (internal/proto), which this package binds for its own
// and shm's sentinels (wire_gen.go, generated from capi/errors.tab); RegisterError gives other
// programs' packages codes from 256 up.
const (
	codeOther         = proto.CodeOther
	codeAuthFailed    = proto.CodeAuthFailed
	codeIncompatible  = proto.CodeIncompatible
	codeFrameTooLarge = proto.CodeFrameTooLarge
	codeUnknownOp     = proto.CodeUnknownOp

	// MinUserErrorCode is the first code RegisterError accepts.
	MinUserErrorCode = proto.MinUserCode
)

// RegisterError gives err a wire code, so that an Owner.Handle handler returning an error that
// wraps err reaches the client as an error that errors.Is(err) still matches (its message is
// the handler's). Register the same code and sentinel in the owner and in every client (a
// package init does both). code must be at least MinUserErrorCode and not yet taken; it panics
// otherwise, as for a duplicate registration. Codes registered later are tried first, so a
// package's own sentinels win over the generic ones they may wrap. The module's own rooms bind
// their codes in internal/proto's table.
func RegisterError(code uint16, err error) {
	if code < MinUserErrorCode || err == nil {
		panic(fmt.Sprintf("ipc.RegisterError: code %d must be >= %d and err non-nil", code, MinUserErrorCode))
	}
	proto.Bind(proto.Pair{Code: code, Err: err})
}

// codeOf finds the wire code of err.
func codeOf(err error) uint16 { return proto.CodeOf(err) }

func sentinelOf(code uint16) error { return proto.Sentinel(code) }

// RemoteError is an error the owner returned for an RPC. Its message is the owner's; errors.Is
// matches the sentinel registered for its code, if this process knows it.
type RemoteError = proto.RemoteError

func remoteError(code uint16, msg string) error { return proto.Decode(code, msg) }
