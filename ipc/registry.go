package ipc

import (
	"container/heap"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/shmsteer/shmsteer/internal/proto"
	"github.com/shmsteer/shmsteer/shm"
)

// KindKey is the shm kind under which the key registry stores its entries: the key is the
// request id, the value the key bytes followed by one state byte (stateLive). The state byte
// goes last so a live Get only drops it: no shift of the key bytes on the hot path. A revoked
// id has no value but a mark under KindKey (shm's Tx.Mark): 32 bytes in the mark table, no
// arena space, so revocations never compete with live keys for room.
const KindKey shm.Kind = proto.KindKey

// MaxRequestIDLen is the longest request id the registry accepts.
const MaxRequestIDLen = 256

const (
	stateLive    byte = 1
	stateRevoked byte = 2
)

// Registry maps request ids to secret keys, in the region every process maps: the
// replacement for the seed's shared dict. Reads (Get, Len, Range) are lock-free loads from the
// mapping in every process. Writes (Set, Remove) are direct in the owner and RPCs to the owner
// in a client. Its methods are safe for concurrent use.
//
// Remove deletes the key and leaves a revoked sentinel, so a generation step still in flight
// gets ErrKeyRevoked rather than ErrKeyNotFound; the owner purges the sentinel after the grace
// period. Setting the id again before then cancels the purge. Remove always fits: the deletion
// uses the arena's deletion reserve and the sentinel the mark table, so a region full of live
// keys can still revoke every one of them.
type Registry struct {
	region *shm.Region
	maxKey int
	w      keyWriter // the owner's local writes or a client's RPCs, chosen by the constructor

	observers *keyObservers // OnChange callbacks (owner; nil in a client)
}

// keyWriter carries a Registry's writes: *Owner writes the region under its key lock (and
// schedules purges), *Client sends each write to the owner as one RPC.
type keyWriter interface {
	keySet(id string, key []byte, o keyOpts) error
	keyRemove(id string, o keyOpts) error
	// revokedIDs lists the ids whose sentinel waits for its purge (known only to the owner).
	revokedIDs() []string
	String() string
}

// KeyChange is one successful key write in the owner: a Set or a Remove made in the owner's
// process or sent by a client (Client.Keys(), the C ABI, Python). It carries no key bytes.
type KeyChange struct {
	RequestID string
	Revoked   bool   // Remove (the revoked sentinel stands); false: Set
	Origin    string // the KeyOrigin option's tag; empty without it (and for clients' writes)
}

// KeyOption qualifies one Set or Remove in the owner.
type KeyOption func(*keyOpts)

type keyOpts struct {
	origin string
	cond   func() error
}

// KeyOrigin tags the write's KeyChange with origin (owner only): a mirror applying another
// host's key tags it, so that it does not publish it back.
func KeyOrigin(origin string) KeyOption { return func(o *keyOpts) { o.origin = origin } }

// KeyIf makes the write conditional (owner only): cond runs with the registry's write lock
// held just before the write, and an error from it aborts the write and is returned.
func KeyIf(cond func() error) KeyOption { return func(o *keyOpts) { o.cond = cond } }

// ownerOnly says whether the options can only be honoured in the owner (all of them can).
func (o keyOpts) ownerOnly() bool { return o.origin != "" || o.cond != nil }

func keyOptsOf(opts []KeyOption) keyOpts {
	var o keyOpts
	for _, f := range opts {
		f(&o)
	}
	return o
}

type keyObservers struct {
	mu sync.RWMutex
	fs []*func(KeyChange)
}

// OnChange registers fn to be called after every successful Set and Remove in the owner,
// whichever process asked for it, in the order of the writes and with the registry's write lock
// held: fn must be quick and must not write keys (a mirror enqueues the change and returns).
// In a client it is never called. The returned function removes fn.
func (k *Registry) OnChange(fn func(KeyChange)) (remove func()) {
	p := &fn
	o := k.observers
	if o == nil {
		return func() {}
	}
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

func (k *Registry) notify(c KeyChange) {
	if k.observers == nil {
		return
	}
	k.observers.mu.RLock()
	fs := k.observers.fs
	k.observers.mu.RUnlock()
	for _, f := range fs {
		(*f)(c)
	}
}

// errKeyOptsOwnerOnly is the error of KeyOrigin or KeyIf in a client.
var errKeyOptsOwnerOnly = fmt.Errorf("%w: KeyOrigin and KeyIf apply in the owner only", shm.ErrBadConfig)

func checkID(id string) error {
	if len(id) == 0 || len(id) > MaxRequestIDLen {
		return fmt.Errorf("%w: %d bytes", ErrRequestIDTooLong, len(id))
	}
	return nil
}

// Set registers key for requestID, replacing any key or revoked sentinel it has (and cancelling
// the sentinel's purge). The registry keeps its own copy; key may be zeroed on return. In the
// owner the write is announced to OnChange's observers.
func (k *Registry) Set(requestID string, key []byte, opts ...KeyOption) error {
	if err := checkID(requestID); err != nil {
		return err
	}
	if len(key) > k.maxKey {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrKeyTooLarge, len(key), k.maxKey)
	}
	return k.w.keySet(requestID, key, keyOptsOf(opts))
}

// Get appends requestID's key to dst and returns it; pass dst[:0] to reuse a buffer. While a
// removed key's sentinel stands it returns dst unchanged and ErrKeyRevoked; for an unknown id
// ErrKeyNotFound. The caller owns the key bytes it gets and should zero them when done.
// A worker's step loop reads faster through a KeyReader of its own (NewReader).
func (k *Registry) Get(requestID string, dst []byte) ([]byte, error) {
	if err := checkID(requestID); err != nil {
		return dst, err
	}
	out, err := k.region.Get(KindKey, requestID, dst)
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
			return dst, ErrKeyRevoked
		case errors.Is(err, shm.ErrNotFound):
			return dst, ErrKeyNotFound
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
		return dst, ErrKeyRevoked
	}
	return dst, fmt.Errorf("%w: key registry entry in state %d", shm.ErrCorrupt, state)
}

// KeyReader reads keys through a reader slot of its own: the fastest way for a worker's step
// loop to read keys; one goroutine at a time. Close it when done.
type KeyReader struct {
	rd *shm.Reader
}

// NewReader returns a KeyReader over the registry's region; it claims a reader slot
// (shm.ErrNoReaderSlot when none is free) until Close.
func (k *Registry) NewReader() (*KeyReader, error) {
	rd, err := k.region.NewReader()
	if err != nil {
		return nil, err
	}
	return &KeyReader{rd: rd}, nil
}

// Get is Registry.Get through the KeyReader's slot, with the same results and errors; with a
// reused dst (dst[:0]) it allocates nothing.
func (kr *KeyReader) Get(requestID string, dst []byte) ([]byte, error) {
	if len(requestID) == 0 || len(requestID) > MaxRequestIDLen {
		return dst, checkID(requestID)
	}
	out, err := kr.rd.Get(KindKey, requestID, dst)
	if n := len(out); err == nil && n > len(dst) && out[n-1] == stateLive { // live: written flat
		out[n-1] = 0
		return out[:n-1], nil
	}
	return decodeEntrySlow(dst, out, err)
}

// Close gives the KeyReader's slot back; ErrClosed if it was already closed.
func (kr *KeyReader) Close() error { return kr.rd.Close() }

// Remove revokes requestID's key: from now on Get returns ErrKeyRevoked, and the owner purges
// the sentinel after the grace period (after which Get returns ErrKeyNotFound). Removing a
// revoked id again is a no-op that keeps the first deadline; an unknown id gives
// ErrKeyNotFound. In the owner the revocation is announced to OnChange's observers.
func (k *Registry) Remove(requestID string, opts ...KeyOption) error {
	if err := checkID(requestID); err != nil {
		return err
	}
	return k.w.keyRemove(requestID, keyOptsOf(opts))
}

// Len counts the request ids with a live key or a standing revoked sentinel (the live keys at
// one version plus the sentinels standing now: the registry is the only user of marks).
func (k *Registry) Len() (int, error) {
	n, _, err := k.Count()
	return n, err
}

// Count returns Len split in two: ids with a live key and revoked sentinels standing. (While
// the mark table is full, sentinels kept in the arena instead count as live here.)
func (k *Registry) Count() (total, revoked int, err error) {
	s, err := k.region.Snapshot()
	if err != nil {
		return 0, 0, err
	}
	defer s.Close()
	live, err := s.Len(KindKey)
	revoked = int(k.region.Stats().Marks)
	return live + revoked, revoked, err
}

// Range calls fn for each request id with a live key (revoked false), at one consistent
// version, and then, in the owner only, for each id whose revoked sentinel stands (revoked
// true), until fn returns false. A sentinel is stored as a hash of the id, so only the owner,
// which schedules its purge, knows the ids; in a client Range lists live keys. It never
// exposes keys.
func (k *Registry) Range(fn func(requestID string, revoked bool) bool) error {
	s, err := k.region.Snapshot()
	if err != nil {
		return err
	}
	more := true
	err = s.Range(KindKey, func(key, value []byte, _ uint64) bool {
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

// keySet writes a live key in the owner, lifts a revoked sentinel of the id and cancels its
// pending purge.
func (o *Owner) keySet(id string, key []byte, opts keyOpts) error {
	o.kmu.Lock()
	defer o.kmu.Unlock()
	if opts.cond != nil {
		if err := opts.cond(); err != nil {
			return err
		}
	}
	_, err := o.region.Update(func(tx *shm.Tx) error {
		if err := tx.PutFunc(KindKey, id, len(key)+1, func(dst []byte) {
			copy(dst, key)
			dst[len(key)] = stateLive
		}); err != nil {
			return err
		}
		return tx.Unmark(KindKey, id)
	})
	if err != nil {
		return err
	}
	o.purges.cancel(id)
	o.keys.notify(KeyChange{RequestID: id, Origin: opts.origin})
	return nil
}

// keyRemove deletes a live key and marks the id revoked, in one transaction, and schedules
// the purge of the mark. The deletion uses the arena's deletion reserve and the mark the mark
// table, so it fits however full the arena is. Should the mark table be full, the key is
// replaced by a revoked entry in the arena (its state byte alone), so readers still get
// ErrKeyRevoked; only if the arena has no room for that either is the key deleted without a
// sentinel (readers then get ErrKeyNotFound for it; RevokedWithoutSentinel counts it): a
// revocation never fails for lack of room. Each case is logged, rate-limited (the 1st, 2nd,
// 4th, 8th... occurrence), since a full table turns every revocation into one. The key's old
// blob is zeroed by shm when no reader can still see it.
func (o *Owner) keyRemove(id string, opts keyOpts) (err error) {
	o.kmu.Lock()
	defer o.kmu.Unlock()
	if opts.cond != nil {
		if err := opts.cond(); err != nil {
			return err
		}
	}
	state, err := o.entry(id)
	if err != nil {
		return err
	}
	if state == stateRevoked {
		return nil
	}
	defer func() { // the key is gone from here on, whatever sentinel could be left
		if err == nil {
			o.keys.notify(KeyChange{RequestID: id, Revoked: true, Origin: opts.origin})
		}
	}()
	v, err := o.region.Update(func(tx *shm.Tx) error {
		if err := tx.Delete(KindKey, id); err != nil {
			return err
		}
		return tx.Mark(KindKey, id)
	})
	if errors.Is(err, shm.ErrRegionFull) { // the mark table is full: a sentinel in the arena
		v, err = o.region.Update(func(tx *shm.Tx) error { return tx.Put(KindKey, id, []byte{stateRevoked}) })
		if n := o.revokeInArena.Add(1); err == nil && n&(n-1) == 0 {
			o.log.Warn("shmsteer: the mark table is full: revoked sentinels go in the arena instead (readers still see ErrKeyRevoked); raise shm.Config.MarkSlots",
				"revocations", n, "markSlots", o.region.Stats().MarkSlots)
		}
	}
	if errors.Is(err, shm.ErrRegionFull) { // and the arena too: delete without a sentinel
		if _, err = o.region.Update(func(tx *shm.Tx) error { return tx.Delete(KindKey, id) }); err != nil {
			return err
		}
		if n := o.revokeUnmarked.Add(1); n&(n-1) == 0 {
			o.log.Warn("shmsteer: key deleted without a revoked sentinel: the mark table and the arena are full; raise shm.Config.MarkSlots and ArenaBytes (readers see ErrKeyNotFound for these ids)",
				"revocations", n)
		}
		return nil
	}
	if err != nil {
		return err
	}
	first := o.purges.schedule(id, v, time.Now().Add(o.grace))
	if first {
		select {
		case o.wake <- struct{}{}:
		default:
		}
	}
	return nil
}

// entry reads the state of id's entry without copying its key: stateLive, stateRevoked, or
// ErrKeyNotFound.
func (o *Owner) entry(id string) (state byte, err error) {
	s, err := o.region.Snapshot()
	if err != nil {
		return 0, err
	}
	defer s.Close()
	v, _, err := s.View(KindKey, id)
	switch {
	case err == shm.ErrMarked:
		return stateRevoked, nil
	case errors.Is(err, shm.ErrNotFound):
		return 0, ErrKeyNotFound
	case err != nil:
		return 0, err
	case len(v) == 0:
		return 0, fmt.Errorf("%w: empty key registry entry", shm.ErrCorrupt)
	}
	return v[len(v)-1], nil
}

// revokedIDs lists the ids whose revoked sentinel waits for its purge, soonest first.
func (o *Owner) revokedIDs() []string {
	o.kmu.Lock()
	defer o.kmu.Unlock()
	items := slices.Clone(o.purges.items)
	slices.SortFunc(items, func(a, b *purgeItem) int { return a.due.Compare(b.due) })
	ids := make([]string, len(items))
	for i, it := range items {
		ids[i] = it.id
	}
	return ids
}

// purgeLoop deletes revoked sentinels whose grace has passed.
func (o *Owner) purgeLoop() {
	defer o.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		o.kmu.Lock()
		now := time.Now()
		for o.purges.Len() > 0 && !o.purges.items[0].due.After(now) {
			it := heap.Pop(&o.purges).(*purgeItem)
			delete(o.purges.byID, it.id)
			o.purgeLocked(it)
		}
		wait := time.Hour
		if o.purges.Len() > 0 {
			wait = o.purges.items[0].due.Sub(now)
		}
		o.kmu.Unlock()
		t.Reset(wait)
		select {
		case <-o.done:
			return
		case <-o.wake:
		case <-t.C:
		}
	}
}

// purgeLocked lifts a sentinel if the id is still revoked. A key set again since lifted the
// sentinel itself and cancelled the purge.
func (o *Owner) purgeLocked(it *purgeItem) {
	if state, err := o.entry(it.id); err != nil || state != stateRevoked {
		return
	}
	inArena := false // a sentinel in the arena (the mark table was full), not a mark
	if s, err := o.region.Snapshot(); err == nil {
		_, _, verr := s.View(KindKey, it.id)
		s.Close()
		inArena = verr == nil
	}
	if _, err := o.region.Update(func(tx *shm.Tx) error {
		if inArena {
			return tx.Delete(KindKey, it.id)
		}
		return tx.Unmark(KindKey, it.id)
	}); err != nil {
		o.log.Warn("shmsteer: purging a revoked key failed", "err", err)
	}
}

// purgeQueue is a min-heap of pending purges by deadline, indexed by request id so that Set
// can cancel one.
type purgeQueue struct {
	items []*purgeItem
	byID  map[string]*purgeItem
}

type purgeItem struct {
	id      string
	version uint64 // version of the sentinel to purge
	due     time.Time
	index   int
}

// schedule adds a purge and reports whether it is now the earliest.
func (q *purgeQueue) schedule(id string, version uint64, due time.Time) bool {
	if q.byID == nil {
		q.byID = map[string]*purgeItem{}
	}
	if old := q.byID[id]; old != nil {
		heap.Remove(q, old.index)
	}
	it := &purgeItem{id: id, version: version, due: due}
	q.byID[id] = it
	heap.Push(q, it)
	return it.index == 0
}

func (q *purgeQueue) cancel(id string) {
	if it := q.byID[id]; it != nil {
		heap.Remove(q, it.index)
		delete(q.byID, id)
	}
}

func (q *purgeQueue) Len() int           { return len(q.items) }
func (q *purgeQueue) Less(i, j int) bool { return q.items[i].due.Before(q.items[j].due) }
func (q *purgeQueue) Swap(i, j int) {
	q.items[i], q.items[j] = q.items[j], q.items[i]
	q.items[i].index, q.items[j].index = i, j
}
func (q *purgeQueue) Push(x any) {
	it := x.(*purgeItem)
	it.index = len(q.items)
	q.items = append(q.items, it)
}
func (q *purgeQueue) Pop() any {
	n := len(q.items)
	it := q.items[n-1]
	q.items[n-1] = nil
	q.items = q.items[:n-1]
	return it
}
