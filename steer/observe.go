package steer

import (
	"errors"
	"sync"

	"github.com/shmsteer/shmsteer/shm"
)

// ChangeKind says which piece of the owner's steering state a Change touched.
type ChangeKind uint8

const (
	ChangeVector ChangeKind = 1 // a named vector (Change.Name) was registered or unregistered
	ChangeGlobal ChangeKind = 2 // the global tiers were set or cleared
	// ChangeProbe (probe.go) is a probe vector (Change.Name) registered or unregistered.
)

// Change describes one successful owner-side write of a named vector or the global tiers. It
// carries no data: an observer that needs the value reads it from the region (Encoding), so a
// burst of writes to one entry costs the observer one read of the newest value.
type Change struct {
	Kind    ChangeKind
	Name    string // the vector's name (ChangeVector); empty for ChangeGlobal
	Deleted bool   // unregistered, or global steering cleared
	Version uint64 // region version of the write
	// Origin is the tag the write was made with: empty for Register, Unregister and SetGlobal,
	// the caller's tag for RegisterAs, UnregisterAs and SetGlobalAs. A mirror applying another
	// host's change tags it, so that it does not publish it back.
	Origin string
}

// observers holds an engine's OnChange callbacks.
type observers struct {
	mu sync.RWMutex
	fs []*func(Change)
}

// OnChange registers fn to be called after every successful owner-side Register, Unregister or
// SetGlobal (and their As variants) of e, in the goroutine that made the write, once the write
// is visible in the region and before the engine's write lock is released, so observers see
// writes in their order and a conditional write (RegisterAs) can rely on what they saw. fn must
// be quick and must not call the engine's writes (it would deadlock): a mirror enqueues the
// change and returns. The returned function removes fn. Workers' writes reach fn through the
// owner's Serve handlers, which call Register and Unregister in the owner.
func (e *Engine) OnChange(fn func(Change)) (remove func()) {
	p := &fn
	o := &e.observers
	o.mu.Lock()
	o.fs = append(o.fs[:len(o.fs):len(o.fs)], p)
	o.mu.Unlock()
	return func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		for i, q := range o.fs {
			if q == p {
				o.fs = append(o.fs[:i:i], o.fs[i+1:]...)
				return
			}
		}
	}
}

func (e *Engine) notify(c Change) {
	e.observers.mu.RLock()
	fs := e.observers.fs
	e.observers.mu.RUnlock()
	for _, f := range fs {
		(*f)(c)
	}
}

// writeOpts tag an owner-side write and make it conditional (observe.go's As variants).
type writeOpts struct {
	origin string
	cond   func() error
}

// check runs the write's condition, with the engine's write lock held.
func (o writeOpts) check() error {
	if o.cond == nil {
		return nil
	}
	return o.cond()
}

// done notifies the observers of a successful write, with the write lock still held (deferred
// after the unlock, so it runs before it).
func (o writeOpts) done(e *Engine, err *error, c Change, v *uint64) {
	if *err == nil {
		c.Version, c.Origin = *v, o.origin
		e.notify(c)
	}
}

// RegisterAs is Register in the owner with its Change tagged origin and, if cond is not nil,
// conditional: cond runs with the engine's write lock held just before the write (after no
// other write of this engine can slip in) and a non-nil error from it aborts the write and is
// returned. A mirror applying another host's value uses cond to give way to a local write that
// its observer has already seen. Owner only (ErrNotOwner in a worker).
func (e *Engine) RegisterAs(origin, name string, vecs []Vector, cond func() error) (VectorInfo, error) {
	if err := e.ownerOnly(); err != nil {
		return VectorInfo{}, err
	}
	return e.register(name, vecs, writeOpts{origin: origin, cond: cond})
}

// UnregisterAs is Unregister with a tagged Change and a condition, as RegisterAs.
func (e *Engine) UnregisterAs(origin, name string, cond func() error) (uint64, error) {
	if err := e.ownerOnly(); err != nil {
		return 0, err
	}
	return e.unregister(name, writeOpts{origin: origin, cond: cond})
}

// SetGlobalAs is SetGlobal with a tagged Change and a condition, as RegisterAs.
func (e *Engine) SetGlobalAs(origin string, g Steering, cond func() error) (uint64, error) {
	return e.setGlobal(g, writeOpts{origin: origin, cond: cond})
}

// Encoding returns the stored encoding (the steering wire format, see DecodeSteering) of the
// entry a Change names, as of snapshot s, and the region version that wrote it; found is false
// if the entry does not exist (unregistered, or no global steering). The bytes alias the
// region and are valid until s closes.
func (e *Engine) Encoding(s *shm.Snapshot, kind ChangeKind, name string) (b []byte, version uint64, found bool, err error) {
	k, key := KindVector, name
	switch kind {
	case ChangeGlobal:
		k, key = KindGlobal, globalKey
	case ChangeProbe:
		k = KindProbe
	}
	b, version, err = s.View(k, key)
	if errors.Is(err, shm.ErrNotFound) {
		return nil, 0, false, nil
	}
	return b, version, err == nil, err
}
