package steer

import (
	"fmt"

	"github.com/shmsteer/shmsteer/shm"
)

// writer carries the writes both sides make to the region. It is chosen once: local (local.go)
// by Open, a transaction under the owner's write mutex; remote (remote.go) by Attach with a
// Caller, one RPC per operation, which the owner's Serve handlers turn into the same local
// calls; readOnly by Attach without one. The owner-only writes (Admit, End, the latches and
// conversations' gates) are methods of Owner and never pass through a writer. Each public write validates its input in the
// calling process, then hands it to the writer; the owner validates again what a worker sent.
type writer interface {
	// putNamed stores the validated encoding b (digest d) as named vector name of kind
	// (KindVector or KindProbe).
	putNamed(kind shm.Kind, name string, b []byte, d Digest, o writeOpts) (VectorInfo, error)
	deleteNamed(kind shm.Kind, name string, o writeOpts) (uint64, error)
	setGlobal(g Steering, o writeOpts) (uint64, error)
	// gateEngaged tells the owner which rest_of_conversation gates engaged (gates_conv.go).
	gateEngaged(keys []uint64) error
	// ownStatus fills the Status fields only the owner knows (published: the status entry
	// was read); elsewhere it leaves them as read from the region.
	ownStatus(st *Status, published bool)
}

// WriteOption qualifies one write of Register, Unregister, RegisterProbe, UnregisterProbe or
// SetGlobal.
type WriteOption func(*writeOpts)

// Origin tags the write's Change (observe.go) with origin; owner only. A mirror applying
// another host's change tags it, so that it does not publish it back.
func Origin(origin string) WriteOption { return func(o *writeOpts) { o.origin = origin } }

// If makes the write conditional; owner only: cond runs with the engine's write lock held just
// before the write (no other write of this engine can slip in after it), and an error from it
// aborts the write and is returned. A mirror applying another host's value uses it to give way
// to a local write its observer has already seen.
func If(cond func() error) WriteOption { return func(o *writeOpts) { o.cond = cond } }

// Merge makes SetGlobal merge its steering into the current global tiers per site
// (MergeSites) instead of replacing them, in the owner under its write lock.
func Merge() WriteOption { return func(o *writeOpts) { o.merge = true } }

// writeOpts is a write's options.
type writeOpts struct {
	origin  string
	cond    func() error
	merge   bool
	hint    string // ModelHint
	hintSet bool
}

func writeOptsOf(opts []WriteOption) writeOpts {
	var o writeOpts
	for _, f := range opts {
		f(&o)
	}
	return o
}

// ownerOnly says whether the options can only be honoured in the owner (a condition is a
// function; an origin tags the owner's observers).
func (o writeOpts) ownerOnly() bool { return o.cond != nil || o.origin != "" }

// check runs the write's condition, with the engine's write lock held.
func (o writeOpts) check() error {
	if o.cond == nil {
		return nil
	}
	return o.cond()
}

// done notifies the observers of a successful write, with the write lock still held (deferred
// after the unlock, so it runs before it).
func (o writeOpts) done(e *Owner, err *error, c Change, v *uint64) {
	if *err == nil {
		c.Version, c.Origin = *v, o.origin
		e.notify(c)
	}
}

// errOwnerOnly is the error of an owner-only operation elsewhere.
var errOwnerOnly = fmt.Errorf("%w: this operation runs in the owner (scheduler)", ErrNotOwner)

// readOnly is the writer of a worker that has no connection to the owner.
type readOnly struct{}

func (readOnly) putNamed(shm.Kind, string, []byte, Digest, writeOpts) (VectorInfo, error) {
	return VectorInfo{}, ErrNotOwner
}
func (readOnly) deleteNamed(shm.Kind, string, writeOpts) (uint64, error) { return 0, ErrNotOwner }
func (readOnly) setGlobal(Steering, writeOpts) (uint64, error)           { return 0, errOwnerOnly }
func (readOnly) gateEngaged([]uint64) error                              { return nil } // no owner to tell
func (readOnly) ownStatus(*Status, bool)                                 {}
