package keys

import (
	"errors"
	"fmt"

	"github.com/shmsteer/shmsteer/internal/proto"
	"github.com/shmsteer/shmsteer/shm"
)

// Kind is the shm kind under which the registry stores its entries: the key is the request
// id, the value the key bytes followed by one state byte (stateLive). The state byte goes last
// so a live Get only drops it: no shift of the key bytes on the hot path. A revoked id has no
// value but a mark under Kind (shm's Tx.Mark): 32 bytes in the mark table, no arena space, so
// revocations never compete with live keys for room.
const Kind shm.Kind = proto.KindKey

// MaxRequestIDLen is the longest request id the registry accepts.
const MaxRequestIDLen = 256

const (
	stateLive    byte = proto.KeyStateLive // capi's C reader copies out only values ending in it
	stateRevoked byte = 2
)

// Registry maps request ids to secret keys, in the region every process maps: the
// replacement for the seed's shared dict. It is what both sides share: an Owner (Open) and a
// Worker (Attach) embed it; code that serves either side takes the *Registry (Owner.Registry,
// Worker.Registry). Reads (Get, Count, Range) are lock-free loads from the mapping in every
// process. Writes (Set, Remove) are direct in the owner and RPCs to the owner in a worker.
// Its methods are safe for concurrent use.
//
// Remove deletes the key and leaves a revoked sentinel, so a generation step still in flight
// gets ErrRevoked rather than ErrNotFound; the owner purges the sentinel after the grace
// period. Setting the id again before then cancels the purge. Remove always fits: the deletion
// uses the arena's deletion reserve and the sentinel the mark table, so a region full of live
// keys can still revoke every one of them.
type Registry struct {
	region *shm.Region
	maxKey int
	w      writer // the owner's local writes or a worker's RPCs, chosen by Open or Attach
}

// writer carries a Registry's writes: *local writes the region under its lock (and schedules
// purges), remote sends each write to the owner as one RPC.
type writer interface {
	set(id string, key []byte, o writeOpts) error
	remove(id string, o writeOpts) error
	// revokedIDs lists the ids whose sentinel waits for its purge (known only to the owner).
	revokedIDs() []string
	String() string
}

// Change is one successful key write in the owner: a Set or a Remove made in the owner's
// process or sent by a worker (Attach, the C ABI, Python). It carries no key bytes.
type Change struct {
	RequestID string
	Revoked   bool   // Remove (the revoked sentinel stands); false: Set
	Origin    string // the Origin option's tag; empty without it (and for workers' writes)
}

// Option qualifies one Set or Remove in the owner.
type Option func(*writeOpts)

type writeOpts struct {
	origin string
	cond   func() error
}

// Origin tags the write's Change with origin (owner only): a mirror applying another host's
// key tags it, so that it does not publish it back.
func Origin(origin string) Option { return func(o *writeOpts) { o.origin = origin } }

// If makes the write conditional (owner only): cond runs with the registry's write lock held
// just before the write, and an error from it aborts the write and is returned.
func If(cond func() error) Option { return func(o *writeOpts) { o.cond = cond } }

// ownerOnly says whether the options can only be honoured in the owner (all of them can).
func (o writeOpts) ownerOnly() bool { return o.origin != "" || o.cond != nil }

func writeOptsOf(opts []Option) writeOpts {
	if len(opts) == 0 {
		return writeOpts{} // the usual write: nothing escapes to the options' funcs
	}
	o := new(writeOpts)
	for _, f := range opts {
		f(o)
	}
	return *o
}

// errOwnerOnly is the error of Origin or If in a worker.
var errOwnerOnly = fmt.Errorf("%w: keys.Origin and keys.If apply in the owner only", shm.ErrBadConfig)

func checkID(id string) error {
	if len(id) == 0 || len(id) > MaxRequestIDLen {
		return fmt.Errorf("%w: %d bytes", ErrRequestIDTooLong, len(id))
	}
	return nil
}

// MaxKeyBytes is the owner's bound on one key (Options.MaxKeyBytes); a worker learns it when
// it attaches, so an oversize Set fails there with ErrTooLarge before any RPC.
func (k *Registry) MaxKeyBytes() int { return k.maxKey }

// Set registers key for requestID, replacing any key or revoked sentinel it has (and cancelling
// the sentinel's purge). The registry keeps its own copy; key may be zeroed on return. The
// owner announces the write to its OnChange observers, whichever process made it.
func (k *Registry) Set(requestID string, key []byte, opts ...Option) error {
	if err := checkID(requestID); err != nil {
		return err
	}
	if len(key) > k.maxKey {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrTooLarge, len(key), k.maxKey)
	}
	return k.w.set(requestID, key, writeOptsOf(opts))
}

// Get appends requestID's key to dst and returns it; pass dst[:0] to reuse a buffer. While a
// removed key's sentinel stands it returns dst unchanged and ErrRevoked; for an unknown id
// ErrNotFound. The caller owns the key bytes it gets and should zero them when done.
// A worker's step loop reads faster through a Reader of its own (NewReader).
func (k *Registry) Get(requestID string, dst []byte) ([]byte, error) {
	if err := checkID(requestID); err != nil {
		return dst, err
	}
	out, err := k.region.Get(Kind, requestID, dst)
	return decodeEntry(dst, out, err)
}

// decodeEntry turns the result of an shm Get of a registry entry, appended to dst, into
// Registry.Get's result: the key appended to dst, or dst unchanged and the entry's error.
// The live case is small enough to inline into the Gets; the rest is decodeEntrySlow.
func decodeEntry(dst, out []byte, err error) ([]byte, error) {
	if n := len(out); err == nil && n > len(dst) && out[n-1] == stateLive {
		out[n-1] = 0
		return out[:n-1], nil
	}
	return decodeEntrySlow(dst, out, err)
}

func decodeEntrySlow(dst, out []byte, err error) ([]byte, error) {
	if err != nil {
		switch {
		case err == shm.ErrMarked:
			return dst, ErrRevoked
		case errors.Is(err, shm.ErrNotFound):
			return dst, ErrNotFound
		}
		return dst, err
	}
	l0, n := len(dst), len(out)
	if n == l0 {
		return dst, fmt.Errorf("%w: empty key registry entry", shm.ErrCorrupt)
	}
	state := out[n-1]
	clear(out[l0:]) // not live: whatever was copied is not the caller's
	if state == stateRevoked {
		return dst, ErrRevoked
	}
	return dst, fmt.Errorf("%w: key registry entry in state %d", shm.ErrCorrupt, state)
}

// Reader reads keys through a reader slot of its own: the fastest way for a worker's step
// loop to read keys; one goroutine at a time. Close it when done.
type Reader struct {
	rd *shm.Reader
}

// NewReader returns a Reader over the registry's region; it claims a reader slot
// (shm.ErrNoReaderSlot when none is free) until Close.
func (k *Registry) NewReader() (*Reader, error) {
	rd, err := k.region.NewReader()
	if err != nil {
		return nil, err
	}
	return &Reader{rd: rd}, nil
}

// Get is Registry.Get through the Reader's slot, with the same results and errors; with a
// reused dst (dst[:0]) it allocates nothing.
func (kr *Reader) Get(requestID string, dst []byte) ([]byte, error) {
	if len(requestID) == 0 || len(requestID) > MaxRequestIDLen {
		return dst, checkID(requestID)
	}
	out, err := kr.rd.Get(Kind, requestID, dst)
	if n := len(out); err == nil && n > len(dst) && out[n-1] == stateLive { // live: written flat
		out[n-1] = 0
		return out[:n-1], nil
	}
	return decodeEntrySlow(dst, out, err)
}

// Close gives the Reader's slot back; shm.ErrClosed if it was already closed.
func (kr *Reader) Close() error { return kr.rd.Close() }

// Descriptor is the Reader's shm.Reader descriptor (shm.Reader.Descriptor), through which the
// C ABI's C reader gets keys without entering Go; valid until Close.
func (kr *Reader) Descriptor() uintptr { return kr.rd.Descriptor() }

// Remove revokes requestID's key: from now on Get returns ErrRevoked, and the owner purges
// the sentinel after the grace period (after which Get returns ErrNotFound). Removing a
// revoked id again is a no-op that keeps the first deadline; an unknown id gives ErrNotFound.
// The owner announces the revocation to its OnChange observers, whichever process made it.
func (k *Registry) Remove(requestID string, opts ...Option) error {
	if err := checkID(requestID); err != nil {
		return err
	}
	return k.w.remove(requestID, writeOptsOf(opts))
}

// Count counts the request ids with a key standing: total is the ids with a live key or a
// standing revoked sentinel (the live keys at one version plus the sentinels standing now: the
// registry is the only user of marks), revoked the sentinels among them. (While the mark table
// is full, sentinels kept in the arena instead count as live here.)
func (k *Registry) Count() (total, revoked int, err error) {
	s, err := k.region.Snapshot()
	if err != nil {
		return 0, 0, err
	}
	defer s.Close()
	live, err := s.Len(Kind)
	revoked = int(k.region.Stats().Marks)
	return live + revoked, revoked, err
}

// Range calls fn for each request id with a live key (revoked false), at one consistent
// version, and then, in the owner only, for each id whose revoked sentinel stands (revoked
// true), until fn returns false. A sentinel is stored as a hash of the id, so only the owner,
// which schedules its purge, knows the ids; in a worker Range lists live keys. It never
// exposes keys.
func (k *Registry) Range(fn func(requestID string, revoked bool) bool) error {
	s, err := k.region.Snapshot()
	if err != nil {
		return err
	}
	more := true
	err = s.Range(Kind, func(key, value []byte, _ uint64) bool {
		if len(value) > 0 && value[len(value)-1] == stateRevoked {
			return true // a sentinel in the arena: listed with the revoked ids below
		}
		more = fn(string(key), false)
		return more
	})
	s.Close()
	if err != nil || !more {
		return err
	}
	for _, id := range k.w.revokedIDs() {
		if !fn(id, true) {
			break
		}
	}
	return nil
}
