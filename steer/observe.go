package steer

import (
	"errors"

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
	// Origin is the tag the write was made with (the Origin option; empty without it). A
	// mirror applying another host's change tags it, so that it does not publish it back.
	Origin string
}

// OnChange registers fn to be called after every successful owner-side Register, Unregister or
// SetGlobal (and the probe writes) of e, in the goroutine that made the write, once the write
// is visible in the region and before the engine's write lock is released, so observers see
// writes in their order and a conditional write (the If option) can rely on what they saw. fn
// must be quick and must not call the engine's writes (it would deadlock): a mirror enqueues
// the change and returns. The returned function removes fn. Workers' writes reach fn through
// the owner's Serve handlers, which make the same writes in the owner.
func (e *Owner) OnChange(fn func(Change)) (remove func()) { return e.observers.Add(fn) }

func (e *Owner) notify(c Change) { e.observers.Notify(c) }

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
