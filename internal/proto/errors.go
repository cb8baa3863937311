package proto

import (
	"errors"
	"fmt"
	"slices"
	"sync"
)

// Code is the wire code of an error in an owner's reply (ipc's OpReplyErr frame carries it
// with the owner's message). Codes below MinUserCode belong to the module's rooms, in blocks;
// codes from MinUserCode up are for other programs' packages (ipc.RegisterError).
type Code = uint16

// Remote error codes. CodeOther is an error with no registered sentinel.
const (
	CodeOther Code = 0

	// The transport and the region (bound by package ipc), block 1–31; 3–6 are the key
	// registry's (bound by package keys, which kept the codes they had in ipc).
	CodeAuthFailed       Code = 1
	CodeIncompatible     Code = 2
	CodeKeyNotFound      Code = 3
	CodeKeyRevoked       Code = 4
	CodeRequestIDTooLong Code = 5
	CodeKeyTooLarge      Code = 6
	CodeFrameTooLarge    Code = 7
	CodeUnknownOp        Code = 8
	CodeProtocol         Code = 9
	CodeClosed           Code = 10
	CodeRegionFull       Code = 11
	CodeValueTooLarge    Code = 12
	CodeShmKeyTooLong    Code = 13
	CodeNotFound         Code = 14
	CodeCorrupt          Code = 15
	CodeBadConfig        Code = 16
	CodeNoReaderSlot     Code = 17
	CodeTimeout          Code = 18
	CodeBusy             Code = 19

	// Steering (bound by package steer), block 32–63.
	CodeBadName       Code = 32
	CodeNonFinite     Code = 33
	CodeHiddenSize    Code = 34
	CodeUnknownHook   Code = 35
	CodeLayerRange    Code = 36
	CodeDuplicate     Code = 37
	CodeBadClamp      Code = 38
	CodeUnknownVector Code = 39
	CodeBadEncoding   Code = 40
	CodeEmptySet      Code = 41
	CodeOverflow      Code = 42
	CodeBadRequestID  Code = 43
	CodeNotOwner      Code = 44
	CodeSteerConfig   Code = 45 // steer.ErrIncompatible
	CodeProbeSite     Code = 46
	CodeBadModelHint  Code = 47

	// The service (bound by package serve), block 64–95.
	CodeServeBadInput Code = 64

	// Capture (bound by package capture), block 96–127.
	CodeCaptureUnknownConsumer Code = 96
	CodeCaptureConsumerTaken   Code = 97
	CodeCaptureNoHub           Code = 98

	// MinUserCode is the first code of other programs' packages.
	MinUserCode Code = 256
)

// ErrUnknownOp means the owner has no handler for an RPC op: register it in the owner (ops
// below MinUserOp are the transport's). ipc returns it; a room that sends ops tests for it with
// errors.Is to say which Serve call the owner is missing.
var ErrUnknownOp = errors.New("shmsteer: no handler for RPC op in the owner")

// binding is one group of sentinels bound together (one Bind call).
type binding []Pair

var (
	mu     sync.RWMutex
	groups []binding
)

// Pair is a code and the sentinel bound to it.
type Pair struct {
	Code Code
	Err  error
}

// Bind binds each pair's sentinel to its code, in this process: an error that wraps the
// sentinel encodes as the code (CodeOf), and a code decodes to an error that matches the
// sentinel (Decode). Call it from the init of the package that declares the sentinels, so the
// owner and every worker that link the package agree. Within one call the first pair whose
// sentinel matches an error wins (list the specific before the general); a later call's pairs
// are tried before an earlier call's, so a package's sentinels win over those of the packages
// it imports (their inits ran first). It panics if a code is bound twice or an error is nil.
func Bind(pairs ...Pair) {
	mu.Lock()
	defer mu.Unlock()
	g := make(binding, 0, len(pairs))
	for _, p := range pairs {
		if p.Err == nil || p.Code == CodeOther {
			panic(fmt.Sprintf("proto.Bind: code %d needs a non-nil sentinel and a code other than CodeOther", p.Code))
		}
		if sentinelLocked(p.Code) != nil || slices.ContainsFunc(g, func(x Pair) bool { return x.Code == p.Code }) {
			panic(fmt.Sprintf("proto.Bind: code %d is already bound", p.Code))
		}
		g = append(g, p)
	}
	groups = append(groups, g)
}

// CodeOf is the code of the first bound sentinel err matches (see Bind for the order), or
// CodeOther.
func CodeOf(err error) Code {
	mu.RLock()
	defer mu.RUnlock()
	for _, g := range slices.Backward(groups) {
		for _, b := range g {
			if errors.Is(err, b.Err) {
				return b.Code
			}
		}
	}
	return CodeOther
}

// Sentinel is the sentinel bound to code in this process, or nil.
func Sentinel(code Code) error {
	mu.RLock()
	defer mu.RUnlock()
	return sentinelLocked(code)
}

func sentinelLocked(code Code) error {
	for _, g := range groups {
		for _, b := range g {
			if b.Code == code {
				return b.Err
			}
		}
	}
	return nil
}

// RemoteError is an error the owner returned for an RPC. Its message is the owner's; errors.Is
// matches the sentinel bound to its code, if this process binds one (Known).
type RemoteError struct {
	Code Code
	Msg  string
	base error
}

func (e *RemoteError) Error() string { return e.Msg }
func (e *RemoteError) Unwrap() error { return e.base }

// Known reports whether this process binds a sentinel to the error's code.
func (e *RemoteError) Known() bool { return e.base != nil }

// Decode is the error an owner's reply with code and msg stands for in this process.
func Decode(code Code, msg string) *RemoteError {
	return &RemoteError{Code: code, Msg: msg, base: Sentinel(code)}
}
