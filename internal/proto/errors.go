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

// CodeOther is an error with no bound sentinel. The module's codes (the Code* constants of
// codes_gen.go) are generated from capi/errors.tab's wire lines, with the proto.Bind of each
// package that declares the sentinels (its wire_gen.go): add a sentinel's code there.
const CodeOther Code = 0

// MinUserCode is the first code of other programs' packages (ipc.RegisterError); the module's
// codes are below it (errors.tab's wire-range lines give each room its block: the transport,
// the region and the key registry 1–31, steering 32–63, the service 64–95, capture 96–127).
const MinUserCode Code = 256

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
