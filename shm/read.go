package shm

import (
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"time"
)

// reclaimStall bounds how long SnapshotAt waits for a reclamation pass in flight. A pass takes
// a barrier and a scan of the reader slots; one still in flight after this long was most likely
// left by an owner that died in the middle of it, and would never end.
var reclaimStall = 2 * time.Second

// pinCurrent claims one of this process's reader slots and pins the current version in it.
// It returns the slot's offset and the pinned version.
func (r *Region) pinCurrent() (uint64, uint64, error) {
	if r.closed.Load() {
		return 0, 0, ErrClosed
	}
	for {
		v := load64(r.data, hVersion)
		n := r.nlocal.Load()
		for i := int32(0); i < n; i++ {
			s := r.local[i].Load()
			if !cas64(r.readers, s+slotPin, 0, v) {
				continue
			}
			// The writer raises the horizon before it scans the slots, so a pin that the
			// scan may have missed sees the raised horizon here and retries.
			if load64(r.data, hHorizon) <= v {
				if r.closed.Load() { // Close may be waiting for pins to drain
					r.unpin(s)
					return 0, 0, ErrClosed
				}
				return s, v, nil
			}
			r.unpin(s)
			n = -1
			break
		}
		if n >= 0 {
			if err := r.claimSlot(n); err != nil {
				return 0, 0, err
			}
		}
	}
}

// pinAt pins an explicit version, for snapshots handed from one process to another.
func (r *Region) pinAt(v uint64) (uint64, error) {
	if v == 0 || v > load64(r.data, hVersion) {
		return 0, fmt.Errorf("%w: version %d", ErrSnapshotFuture, v)
	}
	s, cur, err := r.pinCurrent()
	if err != nil {
		return 0, err
	}
	if cur == v {
		return s, nil
	}
	// Hold the slot at v, then wait until no reclamation pass is in flight and read the
	// horizon it left: every version at or above it is intact, and later passes see our pin.
	r.pinStore(s, v)
	var since time.Time
	for spins := 0; ; spins++ {
		seq := load64(r.data, hReclaimSeq)
		h := load64(r.data, hHorizon)
		if seq&1 == 0 && load64(r.data, hReclaimSeq) == seq {
			if h <= v {
				return s, nil
			}
			r.unpin(s)
			return 0, fmt.Errorf("%w: version %d, oldest kept is %d", ErrSnapshotTooOld, v, h)
		}
		if spins > 64 {
			if since.IsZero() {
				since = time.Now()
			} else if time.Since(since) > reclaimStall {
				r.unpin(s)
				return 0, fmt.Errorf("%w: a reclamation pass has been in flight for over %v, so version %d cannot be pinned safely; the owner probably died during it: read at the current version, or re-attach to a restarted owner", ErrReclaimStalled, reclaimStall, v)
			}
			runtime.Gosched()
		}
	}
}

// unpin leaves a read section. A release store suffices: the writer only needs to see the
// slot cleared after this reader's loads, which amd64 guarantees for a plain store.
func (r *Region) unpin(slot uint64) { storeRelaxed(word64(r.readers, slot+slotPin), 0) }

// pinStore announces version v in a slot. It must be ordered before the reader's next load of
// the horizon: by a fenced store, or, in processes registered for the owner's membarrier, by
// the barrier the owner runs before it scans the slots.
func (r *Region) pinStore(slot, v uint64) {
	if r.relaxed {
		storeRelaxed(word64(r.readers, slot+slotPin), v)
	} else {
		store64(r.readers, slot+slotPin, v)
	}
}

// claimSlot adds a free reader slot to this process's pool, unless another goroutine already
// added one since the caller saw have slots.
func (r *Region) claimSlot(have int32) error {
	r.slotMu.Lock()
	defer r.slotMu.Unlock()
	n := r.nlocal.Load()
	if n != have {
		return nil
	}
	if n == maxLocalSlots {
		if r.snapPins.Load() >= maxLocalSlots {
			// Every local slot is held by an open Snapshot: none comes free by waiting.
			return fmt.Errorf("%w: this process holds %d open snapshots, the most it pins at once; close snapshots (in Python, release views) before reading more", ErrNoReaderSlot, maxLocalSlots)
		}
		runtime.Gosched() // every local slot busy with a short read: wait for one rather than hoard more
		return nil
	}
	s, err := r.claimFreeSlotLocked()
	if err != nil {
		return err
	}
	r.local[n].Store(s)
	r.nlocal.Store(n + 1)
	return nil
}

// claimFreeSlotLocked marks a free reader slot as this process's and returns its offset. The
// caller holds slotMu. A reader takes its lease (an OFD lock on the slot) before it writes the
// slot's owner word, so the owner never sees a claimed slot without a lease behind it.
func (r *Region) claimFreeSlotLocked() (uint64, error) {
	if r.closed.Load() {
		return 0, ErrClosed
	}
	for i := uint64(0); i < r.l.readerSlots; i++ {
		s := slotOff(i)
		if load64(r.readers, s+slotOwner) != 0 {
			continue
		}
		if r.lease != nil {
			ok, err := lockSlot(r.lease, s)
			if err != nil {
				return 0, err
			}
			if !ok {
				continue // another process is claiming or releasing it
			}
		}
		if !cas64(r.readers, s+slotOwner, 0, r.me) {
			if r.lease != nil {
				unlockSlot(r.lease, s)
			}
			continue
		}
		store64(r.readers, s+slotPin, 0)
		store64(r.readers, s+slotPID, uint64(os.Getpid()))
		for {
			hw := load64(r.readers, rHighWater)
			if hw > i || cas64(r.readers, rHighWater, hw, i+1) {
				break
			}
		}
		r.claimed[s] = true
		return s, nil
	}
	return 0, fmt.Errorf("%w: all %d claimed; create the region with more ReaderSlots or close idle readers", ErrNoReaderSlot, r.l.readerSlots)
}

// releaseSlot gives a slot back; the caller holds slotMu. The lease goes last, so the owner
// never finds this slot claimed and unleased while we still use it.
func (r *Region) releaseSlot(s uint64) {
	store64(r.readers, s+slotPin, 0)
	cas64(r.readers, s+slotOwner, r.me, 0)
	if r.lease != nil {
		unlockSlot(r.lease, s)
	}
	delete(r.claimed, s)
}

// Reader is a read handle with a reader slot of its own, for one goroutine at a time: a worker's
// step loop, say. Its Get needs no atomic read-modify-write, so it is the fastest way to read a
// region; Region.Get is the goroutine-safe equivalent. Close it to give the slot back.
type Reader struct {
	r    *Region
	slot uint64
	// The Region's rmem with this Reader's pin word, copied so the hot path does not go through
	// the Region's mapped pointer; the C reader's descriptor is its image. Behind a pointer, as
	// Region's mapped is, so that printing a Reader never reaches the mapping; atomic, because
	// Region.Close swaps in closedMem while the Reader's goroutine may be reading.
	m    atomic.Pointer[rmem]
	busy bool      // a Snapshot taken from this Reader is open
	desc *descPage // the descriptor for the C reader (desc.go); nil if none
}

// NewReader claims a reader slot for a new Reader.
func (r *Region) NewReader() (*Reader, error) {
	r.slotMu.Lock()
	defer r.slotMu.Unlock()
	s, err := r.claimFreeSlotLocked()
	if err != nil {
		return nil, err
	}
	m := r.m
	m.pin = word64(r.readers, s+slotPin)
	rd := &Reader{r: r, slot: s, desc: allocDesc()}
	m.state = &m.ownState
	rd.m.Store(&m)
	if rd.desc != nil {
		rd.fillDesc()
		m.state = word64(rd.desc[:], dState)
	}
	r.open[rd] = true
	return rd, nil
}

func (rd *Reader) pin() (uint64, error) {
	if rd.busy {
		return 0, ErrReaderBusy
	}
	r := rd.r
	if r.closed.Load() {
		return 0, ErrClosed
	}
	for {
		v := load64(r.data, hVersion)
		r.pinStore(rd.slot, v)
		if load64(r.data, hHorizon) <= v {
			if r.closed.Load() {
				r.unpin(rd.slot)
				return 0, ErrClosed
			}
			return v, nil
		}
	}
}

// Get appends the value of (kind, key) at the current version to dst, like Region.Get. This is
// the hot path of a worker's step, written flat. Where pinlessGet holds (amd64), it stores
// nothing: it reads the current version v, finds and copies the value visible at v, and then
// validates the copy, as a seqlock reader does. A reclamation pass raises the horizon above v
// before it frees or reuses anything visible at v, and loads are not reordered with later loads,
// so a horizon still at or below v after the copy means no byte it read was reclaimed; and a
// state word still 0 means the Reader and its region were open throughout (Close sets it before
// it parks the mapping, see Region.park). A copy that fails either check is dropped and the Get
// is done again pinned: one relaxed store to pin, one to unpin, the path where pinlessGet is off.
func (rd *Reader) Get(kind Kind, key string, dst []byte) ([]byte, error) {
	if rd.r == nil {
		return dst, ErrClosed
	}
	if rd.busy {
		return dst, ErrReaderBusy
	}
	k := stringBytes(key)
	m := rd.m.Load()
	if pinlessGet {
		if v := ldWord(m.version); v != 0 {
			if res, a, n := getAt(m, uint64(kind), k, v); res == resFound {
				out := append(dst, m.arena[a:a+n]...)
				if validAt(m, v) {
					return out, nil
				}
			}
		}
		m = rd.m.Load() // Close may have swapped it
	}
	res, a, n := getAt(m, uint64(kind), k, 0) // pins
	if res == resFound {
		dst = append(dst, m.arena[a:a+n]...)
		storeRelaxed(m.pin, 0)
		return dst, nil
	}
	return rd.getRest(m, res, a, n, kind, k, dst)
}

// validAt reports whether a read at version v that took no pin read only memory that was
// live at v throughout: the horizon has not passed v, and the Reader is neither closed nor
// busy. It must come after the read's last load.
func validAt(m *rmem, v uint64) bool {
	return ldWord(m.horizon) <= v && ldState(m) == 0
}

// getRest is the rest of Reader.Get, after getAt pinned (or, for resBadKey, did not) and did
// not answer resFound.
func (rd *Reader) getRest(m *rmem, res, a, n uint64, kind Kind, key []byte, dst []byte) ([]byte, error) {
	r, v := rd.r, a // resRetry: a is the version getAt pinned
	if res != resRetry {
		v = ldWord(m.pin)
	} else {
		storeRelaxed(m.pin, 0)
		var err error
		if v, err = rd.pin(); err != nil { // closed, or the writer moved the horizon: take the loop
			return dst, err
		}
		if res, a, n = getAt(m, uint64(kind), key, v); res == resFound {
			dst = append(dst, m.arena[a:a+n]...)
			storeRelaxed(m.pin, 0)
			return dst, nil
		}
	}
	dst, err := r.getRest(res, a, n, kind, key, v, dst)
	storeRelaxed(m.pin, 0)
	return dst, err
}

// Snapshot pins the current version in the Reader's slot. The Reader cannot be used again
// until the snapshot is closed, and the snapshot must be used by the Reader's goroutine.
func (rd *Reader) Snapshot() (Snapshot, error) {
	v, err := rd.pin()
	if err != nil {
		return Snapshot{}, err
	}
	rd.busy = true
	rd.setDescState(descBusy, true)
	return Snapshot{r: rd.r, slot: rd.slot, version: v, owner: rd}, nil
}

// Close gives the Reader's slot back.
func (rd *Reader) Close() error {
	if rd.r == nil {
		return ErrClosed
	}
	rd.setDescState(descClosed, true)
	rd.r.slotMu.Lock()
	if !rd.r.closed.Load() {
		rd.r.releaseSlot(rd.slot)
	}
	delete(rd.r.open, rd)
	if rd.r.parked && len(rd.r.open) == 0 {
		rd.r.parked = false
		_ = rd.r.unmap() // the last Reader the closed region's mappings were parked for
	}
	rd.r.slotMu.Unlock()
	m := rd.m.Load()
	m.ownState, m.state = atomic.LoadUint64(m.state), &m.ownState // off the descriptor before it goes
	freeDesc(rd.desc)
	rd.desc, rd.r = nil, nil
	return nil
}

// lookup finds the newest blob of (kind, key) whose version is at most v.
func (r *Region) lookup(kind Kind, key []byte, v uint64) (blob, error) {
	off, _, err := r.find(kind, key)
	if err != nil {
		return blob{}, err
	}
	b, err := readBlob(r.arena, off)
	if err != nil {
		return b, err
	}
	return r.atVersion(b, v)
}

// find probes the index for (kind, key) and returns the arena offset of its newest blob,
// whatever that blob's version, with the blob's meta word. It checks only what the probe needs
// (kind, key length and key bytes, inside the arena); callers decode the rest.
func (r *Region) find(kind Kind, key []byte) (off, meta uint64, err error) {
	if kind == 0 {
		return 0, 0, ErrBadKind
	}
	if len(key) == 0 || len(key) > MaxKeyLen {
		return 0, 0, ErrKeyTooLong
	}
	h := keyHash(r.l.hashK0, r.l.hashK1, uint64(kind), key)
	mask := r.l.mask()
	arena := r.arena
	// The arena is at least minArenaBytes, so this does not underflow.
	lastOff := uint64(len(arena)) - bKey - uint64(len(key))
	want := uint64(kind)<<32 | uint64(len(key))
	for i := uint64(0); i < r.l.maxProbe; i++ {
		w := load64(r.index, ((h+i)&mask)*8)
		if w == 0 {
			break
		}
		if w == tombstone || uint32(w>>32) != uint32(h>>32) {
			continue
		}
		off = (uint64(uint32(w)) - 1) * blobAlign
		if off > lastOff {
			return 0, 0, fmt.Errorf("%w: index word %#x points outside the arena", ErrCorrupt, w)
		}
		meta = load64(arena, off+bMeta)
		if (meta>>32&0xffff)<<32|uint64(uint32(load64(arena, off+bLens))) != want ||
			string(arena[off+bKey:off+bKey+uint64(len(key))]) != string(key) {
			continue
		}
		return off, meta, nil
	}
	return 0, 0, ErrNotFound
}

// getRest answers a get that the generated reader's getAt (the one probe loop, shared with the
// C reader) did not answer with resFound: a miss (marked or not), corruption, and the general
// path for version chains, deletion markers and bad input (its typed error).
func (r *Region) getRest(res, a, n uint64, kind Kind, key []byte, v uint64, dst []byte) ([]byte, error) {
	switch res {
	case resMiss:
		return dst, r.notFound(kind, key, v)
	case resCorrupt:
		if n == 0 {
			return dst, fmt.Errorf("%w: index word %#x points outside the arena", ErrCorrupt, a)
		}
		return dst, fmt.Errorf("%w: blob at %d has bad lengths", ErrCorrupt, a)
	}
	b, err := r.lookup(kind, key, v) // resOlder: an older version, or deleted; resBadKey
	if err == ErrNotFound {
		err = r.notFound(kind, key, v)
	}
	if err != nil {
		return dst, err
	}
	return append(dst, b.value(r.arena)...), nil
}

// atVersion walks a key's version chain back to the newest blob not above v.
func (r *Region) atVersion(b blob, v uint64) (blob, error) {
	for steps := 0; b.version > v; steps++ {
		if b.prev == 0 {
			return blob{}, ErrNotFound // created after v
		}
		p, err := readBlob(r.arena, (b.prev-1)*blobAlign)
		if err != nil {
			return p, err
		}
		if p.version >= b.version || p.kind != b.kind || p.keyLen != b.keyLen || steps >= maxChain {
			return p, fmt.Errorf("%w: broken version chain at %d", ErrCorrupt, b.off)
		}
		b = p
	}
	if b.deleted() {
		return blob{}, ErrNotFound
	}
	return b, nil
}

// Get appends the value stored under (kind, key) at the current version to dst and returns
// it; pass dst[:0] to reuse a buffer without allocating. ErrNotFound if there is none.
func (r *Region) Get(kind Kind, key string, dst []byte) ([]byte, error) {
	slot, v, err := r.pinCurrent()
	if err != nil {
		return dst, err
	}
	k := stringBytes(key)
	res, a, n := getAt(&r.m, uint64(kind), k, v)
	if res == resFound {
		dst = append(dst, r.arena[a:a+n]...)
	} else {
		dst, err = r.getRest(res, a, n, kind, k, v, dst)
	}
	r.unpin(slot)
	return dst, err
}

// Snapshot is a pinned version of a region: every lookup through it sees that version, and the
// memory of every value it returns stays untouched until Close, however the writer goes on. A
// Snapshot is a small value: copy it freely, but Close exactly one copy, once, and use no copy
// after that. Its read methods are safe for concurrent use.
type Snapshot struct {
	r       *Region
	slot    uint64
	version uint64
	owner   *Reader // the Reader whose slot this is, if any
}

// Snapshot pins the current version.
func (r *Region) Snapshot() (Snapshot, error) {
	slot, v, err := r.pinCurrent()
	if err != nil {
		return Snapshot{}, err
	}
	r.snapPins.Add(1)
	return Snapshot{r: r, slot: slot, version: v}, nil
}

// SnapshotAt pins a version published earlier, in this process or another (a scheduler can hand
// one version to every tensor-parallel rank). ErrSnapshotTooOld if its data was already
// reclaimed: that cannot happen while any process holds a snapshot at or below it.
func (r *Region) SnapshotAt(version uint64) (Snapshot, error) {
	slot, err := r.pinAt(version)
	if err != nil {
		return Snapshot{}, err
	}
	r.snapPins.Add(1)
	return Snapshot{r: r, slot: slot, version: version}, nil
}

// Version is the pinned version.
func (s *Snapshot) Version() uint64 { return s.version }

// Close unpins the snapshot; views taken from it must not be used afterwards.
func (s *Snapshot) Close() {
	if s.r != nil {
		s.r.unpin(s.slot)
		if s.owner != nil {
			s.owner.busy = false
			s.owner.setDescState(descBusy, false)
		} else {
			s.r.snapPins.Add(-1)
		}
		s.r = nil
	}
}

// PinWords are the words of the mapping a caller outside Go needs to release this snapshot's
// pin and to pin its slot again (capi's plan.c, which ends and begins the steps of a steady
// native batch in C): the slot's pin word (Close stores zero there; then call Forget), the
// region's version word and its reclamation horizon. Pinning again is pinCurrent's protocol on
// this one slot: with the version word at v, compare-and-swap the pin word from zero to v,
// then the pin holds if the horizon is at most v, else store zero. Nil for a closed snapshot
// or one pinned through a Reader. The words stay valid while the Region is open.
func (s *Snapshot) PinWords() (pin, version, horizon *uint64) {
	if s.r == nil || s.owner != nil {
		return nil, nil, nil
	}
	return word64(s.r.readers, s.slot+slotPin), word64(s.r.data, hVersion), word64(s.r.data, hHorizon)
}

// Forget drops a snapshot whose pin the caller released through PinWords: Close without the
// unpin (the slot is left alone: another snapshot may pin it already). A snapshot pinned
// through a Reader, which has no PinWords, is closed.
func (s *Snapshot) Forget() {
	if s.r == nil {
		return
	}
	if s.owner != nil {
		s.Close()
		return
	}
	s.r.snapPins.Add(-1)
	s.r = nil
}

func (s *Snapshot) find(kind Kind, key string) (blob, error) {
	if s.r == nil {
		return blob{}, ErrClosed
	}
	b, err := s.r.lookup(kind, stringBytes(key), s.version)
	if err == ErrNotFound {
		err = s.r.notFound(kind, stringBytes(key), s.version)
	}
	return b, err
}

// Marked reports whether (kind, key) carries a mark at the snapshot's version (Tx.Mark).
func (s *Snapshot) Marked(kind Kind, key string) (bool, error) {
	if s.r == nil {
		return false, ErrClosed
	}
	return s.r.marked(kind, stringBytes(key), s.version), nil
}

// Get appends the value of (kind, key) at the snapshot's version to dst.
func (s *Snapshot) Get(kind Kind, key string, dst []byte) ([]byte, error) {
	b, err := s.find(kind, key)
	if err != nil {
		return dst, err
	}
	return append(dst, b.value(s.r.arena)...), nil
}

// View returns the value of (kind, key) without copying, and the version that wrote it. The
// bytes are read-only (in readers they are mapped read-only; writing them faults) and valid
// until the snapshot is closed.
func (s *Snapshot) View(kind Kind, key string) ([]byte, uint64, error) {
	b, err := s.find(kind, key)
	if err != nil {
		return nil, 0, err
	}
	return b.value(s.r.arena), b.version, nil
}

// ViewFloat32 is View for values written as float32s (Tx.PutFloat32); the view is 64-byte
// aligned. ErrCorrupt if the value's length is not a multiple of 4.
func (s *Snapshot) ViewFloat32(kind Kind, key string) ([]float32, uint64, error) {
	v, ver, err := s.View(kind, key)
	if err != nil {
		return nil, 0, err
	}
	if len(v)%4 != 0 {
		return nil, 0, fmt.Errorf("%w: value of %d bytes is not float32s", ErrCorrupt, len(v))
	}
	return AsFloat32(v), ver, nil
}

// heads calls fn with every index word that points at a blob, and that blob decoded, until fn
// returns false or an error.
func (s *Snapshot) heads(fn func(word uint64, head blob) (bool, error)) error {
	if s.r == nil {
		return ErrClosed
	}
	r := s.r
	for i := uint64(0); i < r.l.indexSlots; i++ {
		w := load64(r.index, i*8)
		off, ok := wordOffset(w)
		if !ok {
			continue
		}
		b, err := readBlob(r.arena, off)
		if err != nil {
			return err
		}
		if more, err := fn(w, b); !more || err != nil {
			return err
		}
	}
	return nil
}

// Range calls fn for every live value of kind at the snapshot's version, in index order, until
// fn returns false. key and value are views valid until the snapshot is closed.
func (s *Snapshot) Range(kind Kind, fn func(key, value []byte, version uint64) bool) error {
	return s.heads(func(_ uint64, b blob) (bool, error) {
		if b.kind != kind {
			return true, nil
		}
		b, err := s.r.atVersion(b, s.version)
		if err == ErrNotFound {
			return true, nil
		} else if err != nil {
			return false, err
		}
		return fn(b.key(s.r.arena), b.value(s.r.arena), b.version), nil
	})
}

// Len counts the live values of kind at the snapshot's version by walking the index.
func (s *Snapshot) Len(kind Kind) (int, error) {
	n := 0
	err := s.Range(kind, func(_, _ []byte, _ uint64) bool { n++; return true })
	return n, err
}

// Check verifies every blob reachable from the index at the snapshot's version: bounds,
// fingerprints, version chains and content checksums. It is for tests and operators (fsck),
// not the hot path.
func (s *Snapshot) Check() error {
	return s.heads(func(w uint64, b blob) (bool, error) {
		r := s.r
		if h := keyHash(r.l.hashK0, r.l.hashK1, uint64(b.kind), b.key(r.arena)); h>>32 != w>>32 {
			return false, fmt.Errorf("%w: index word %#x has a wrong fingerprint", ErrCorrupt, w)
		}
		b, err := r.atVersion(b, s.version)
		if err == ErrNotFound {
			return true, nil
		} else if err != nil {
			return false, err
		}
		return true, b.verify(r.arena)
	})
}
