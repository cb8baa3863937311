package shm

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// writer is the owner's private write state. Nothing here is shared with other processes, so a
// crash of the owner cannot leave it half-updated in anyone else's memory.
type writer struct {
	mu    sync.Mutex
	alloc *allocator
	// tx is the Tx of the Update in progress: one per writer, reset by every Update, so
	// handing fn a *Tx allocates nothing; its ops array, cleared, carries over to the next
	// Update unless it grew past keepOps (dropOps).
	tx      Tx
	retired []retiredBlob // in retire-version order
	markers []marker      // deletion markers still linked, in version order
	// liveness caches lease checks by slot owner word, so a pass with many readers costs one
	// fcntl per reader per livenessEvery, not one per pass.
	liveness map[uint64]time.Time
	pending  int // commits since the last reclamation pass
	// dirty tells the background loop (reclaimLoop, started by the first commit: looping says
	// so) that commits happened since its last pass. passing is set between a background
	// pass's first step (horizon raised) and its last; pass counts passes, so a background pass
	// that an inline one overtook knows to stop. safe is the horizon the last completed pass
	// confirmed: every pin is at or above it (hHorizon may be raised above it while a pass
	// waits for its barrier, which unlinkMarkers must not trust).
	dirty            atomic.Bool
	looping, passing bool
	pass             uint64
	safe             uint64
	// barrier is a pass's barrier: globalBarrier (a field so tests can hold a pass in it).
	barrier func() error
	// lastBound describes the pin that limited the last pass, for ErrRegionFull messages.
	lastBound PinInfo

	// The mark table's private bookkeeping (marks.go).
	markFree    map[uint64]bool // reclaimed entries that may take new marks
	markRemoved []markRef       // entries unmarked at a version, in version order
	markRetired []markRef       // tombstones waiting for every pin to pass their version

	cols *columns // the column pool's private bookkeeping (columns.go); nil: no pool

	// tombs counts the index words made tombstones since the last sweepTombstones, which
	// marks the words live keys' probe paths cross in covered (tombstones.go).
	tombs   uint64
	covered []uint64
}

type retiredBlob struct{ off, size, version uint64 }

type marker struct{ slot, word, version, off, size uint64 }

const (
	livenessEvery = 50 * time.Millisecond
	// The background loop runs a reclamation pass every reclaimTick while commits come, and
	// backs off to reclaimIdle when they stop. A pass runs inline when an allocation fails,
	// when space runs low (see commit), and after reclaimInline commits without a pass (the
	// loop starved of CPU).
	reclaimTick   = time.Millisecond
	reclaimIdle   = 128 * time.Millisecond
	reclaimInline = 1024
)

func newWriter(l layout) *writer {
	w := &writer{alloc: newAllocator(l.arenaSize), liveness: map[uint64]time.Time{}, markFree: map[uint64]bool{}, safe: 1, barrier: globalBarrier}
	if l.columns != 0 {
		w.cols = newColumns(l)
	}
	return w
}

// Tx is one atomic write: every Put and Delete in it is published with one version, so readers
// see all of it or none. A Tx is used by one goroutine, inside Region.Update, and must not be
// kept after Update's fn returns: the region's next Update reuses it.
type Tx struct {
	r       *Region
	version uint64
	ops     []txOp
	marks   []markOp
	cols    []int // columns reserved by this Tx (AllocColumn)
	done    bool  // committed or aborted: its columns are no longer its own
}

type txOp struct {
	kind     Kind
	key      string
	hash     uint64
	slot     uint64 // index word number
	old      uint64 // index word before the Tx
	oldBlob  blob   // head blob before the Tx, valid if hadOld
	hadOld   bool
	off      uint64 // new blob
	size     uint64
	isDelete bool
	cols     []int // columns attached to the new value (Attach)
}

// Update runs fn in a transaction and publishes its writes with one new version, which it
// returns. If fn or any write fails, nothing is published and every existing value stays as it
// was. Only the owner may write.
func (r *Region) Update(fn func(tx *Tx) error) (uint64, error) {
	w := r.w
	if w == nil {
		return 0, ErrReadOnly
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if r.closed.Load() {
		return 0, ErrClosed
	}
	tx := &w.tx
	*tx = Tx{r: r, version: load64(r.data, hVersion) + 1, ops: tx.ops[:0]}
	defer func() { tx.done = true }()
	if err := fn(tx); err != nil {
		tx.abort()
		return 0, err
	}
	r.commit(tx)
	return tx.version, nil
}

// Put stores value under (kind, key) in its own transaction and returns its version.
func (r *Region) Put(kind Kind, key string, value []byte) (uint64, error) {
	return r.Update(func(tx *Tx) error { return tx.Put(kind, key, value) })
}

// Delete removes (kind, key) in its own transaction. ErrNotFound if it has no live value.
func (r *Region) Delete(kind Kind, key string) (uint64, error) {
	return r.Update(func(tx *Tx) error { return tx.Delete(kind, key) })
}

// Put stores a copy of value under (kind, key).
func (tx *Tx) Put(kind Kind, key string, value []byte) error {
	return tx.PutFunc(kind, key, len(value), func(dst []byte) { copy(dst, value) })
}

// PutFloat32 stores v as float32s, readable zero-copy with Snapshot.ViewFloat32.
func (tx *Tx) PutFloat32(kind Kind, key string, v []float32) error {
	return tx.PutFunc(kind, key, 4*len(v), func(dst []byte) { copy(AsFloat32(dst), v) })
}

// PutFunc stores an n-byte value that fill writes in place, straight into the region. fill must
// write all n bytes and must not keep dst.
func (tx *Tx) PutFunc(kind Kind, key string, n int, fill func(dst []byte)) error {
	if n < 0 || n > MaxValueLen || uint64(n) > tx.r.l.arenaSize {
		return fmt.Errorf("%w: %d bytes", ErrValueTooLarge, n)
	}
	op, err := tx.plan(kind, key, n, false)
	if err != nil {
		return err
	}
	arena := tx.r.arena
	vo := op.off + valueOffset(len(key), n)
	fill(arena[vo : vo+uint64(n) : vo+uint64(n)])
	sealBlob(arena, op.off, len(key), n)
	return nil
}

// Delete removes (kind, key). ErrNotFound if it has no live value as the Tx sees it.
func (tx *Tx) Delete(kind Kind, key string) error {
	op, err := tx.plan(kind, key, 0, true)
	if err != nil || op == nil {
		return err
	}
	sealBlob(tx.r.arena, op.off, len(key), 0)
	return nil
}

// plan finds the index word for (kind, key), allocates the new blob and writes its header; the
// caller fills the value. A second write of the same key in one Tx replaces the first. It
// returns a nil op for a delete that cancels a key created earlier in the same Tx.
func (tx *Tx) plan(kind Kind, key string, valueLen int, isDelete bool) (*txOp, error) {
	r := tx.r
	if kind == 0 {
		return nil, ErrBadKind
	}
	if len(key) == 0 || len(key) > MaxKeyLen {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrKeyTooLong, len(key), MaxKeyLen)
	}
	kb := stringBytes(key)
	h := keyHash(r.l.hashK0, r.l.hashK1, uint64(kind), kb)
	op, fresh, err := tx.findSlot(kind, key, kb, h)
	if err != nil {
		return nil, err
	}
	// Whether the key holds a value before the Tx, and as the Tx sees it now.
	preLive := op.hadOld && !op.oldBlob.deleted()
	live := preLive
	if !fresh {
		live = !op.isDelete
	}
	if isDelete && !live {
		if fresh {
			tx.dropOp(op)
		}
		return nil, fmt.Errorf("%w: nothing to delete", ErrNotFound)
	}
	if isDelete && !preLive { // created and deleted in this Tx: forget both
		tx.detach(op)
		tx.release(op.off, op.size)
		tx.dropOp(op)
		return nil, nil
	}
	var prev uint64
	if op.hadOld {
		prev = op.oldBlob.off/blobAlign + 1
	}
	size := blobSize(len(key), valueLen)
	limit := r.l.arenaSize - r.l.deleteRes
	if isDelete {
		limit = r.l.arenaSize
	}
	off, ok := r.w.alloc.alloc(size, limit)
	if !ok {
		r.reclaimLocked()
		off, ok = r.w.alloc.alloc(size, limit)
	}
	if !ok {
		if fresh {
			tx.dropOp(op)
		}
		return nil, r.arenaFull(size, isDelete)
	}
	if !fresh { // replace what this Tx planned earlier for the key
		tx.detach(op)
		tx.release(op.off, op.size)
	}
	var flags uint16
	if isDelete {
		flags = flagDeleted
	}
	writeBlobHeader(r.arena, off, kind, flags, kb, valueLen, tx.version, prev)
	op.off, op.size, op.isDelete = off, size, isDelete
	return op, nil
}

// release frees a blob no reader can have seen (planned in this Tx, never linked).
func (tx *Tx) release(off, size uint64) {
	zero(tx.r.arena[off : off+size])
	tx.r.w.alloc.release(off, size)
}

// abort frees everything the Tx planned; nothing of it was linked.
func (tx *Tx) abort() {
	for _, op := range tx.ops {
		tx.release(op.off, op.size)
	}
	tx.dropOps()
	tx.abortMarks()
	tx.abortColumns()
}

// keepOps is the most ops whose array a finished Tx leaves to the next Update.
const keepOps = 16

// dropOps ends the Tx's ops: their array is cleared to its capacity (it held keys and column
// lists, also past the length where dropOp shortened it) and kept for the writer's next Update,
// unless it grew past keepOps.
func (tx *Tx) dropOps() {
	if cap(tx.ops) > keepOps {
		tx.ops = nil
		return
	}
	clear(tx.ops[:cap(tx.ops)])
	tx.ops = tx.ops[:0]
}

// dropOp forgets an op that planned nothing.
func (tx *Tx) dropOp(op *txOp) {
	for i := range tx.ops {
		if &tx.ops[i] == op {
			tx.ops = append(tx.ops[:i], tx.ops[i+1:]...)
			return
		}
	}
}

// findSlot returns the Tx's op for (kind, key), creating it: the word holding the key if it is
// in the index, else the first empty or tombstone word on its probe path.
func (tx *Tx) findSlot(kind Kind, key string, kb []byte, h uint64) (op *txOp, fresh bool, err error) {
	for i := range tx.ops {
		if op := &tx.ops[i]; op.kind == kind && op.key == key {
			return op, false, nil
		}
	}
	r := tx.r
	mask := r.l.mask()
	free := int64(-1)
probe:
	for i := uint64(0); i < r.l.maxProbe; i++ {
		s := (h + i) & mask
		for j := range tx.ops {
			if tx.ops[j].slot == s {
				continue probe // taken by another key of this Tx
			}
		}
		w := load64(r.index, s*8)
		switch {
		case w == 0:
			if free < 0 {
				free = int64(s)
			}
			break probe
		case w == tombstone:
			if free < 0 {
				free = int64(s)
			}
			continue
		case uint32(w>>32) != uint32(h>>32):
			continue
		}
		off, _ := wordOffset(w)
		b, err := readBlob(r.arena, off)
		if err != nil {
			return nil, false, err
		}
		if b.kind == kind && string(b.key(r.arena)) == key {
			tx.ops = append(tx.ops, txOp{kind: kind, key: key, hash: h, slot: s, old: w, oldBlob: b, hadOld: true})
			return &tx.ops[len(tx.ops)-1], true, nil
		}
	}
	if free < 0 {
		return nil, false, r.indexFull()
	}
	s := uint64(free)
	tx.ops = append(tx.ops, txOp{kind: kind, key: key, hash: h, slot: s, old: load64(r.index, s*8)})
	return &tx.ops[len(tx.ops)-1], true, nil
}

// commit links the Tx's blobs, retires what they replace and publishes the new version.
func (r *Region) commit(tx *Tx) {
	w, v := r.w, tx.version
	var dEntries, dLive int64
	var retired uint64
	for i := range tx.ops {
		op := &tx.ops[i]
		r.commitColumns(op, v)
		word := indexWord(op.hash, op.off)
		store64(r.index, op.slot*8, word)
		if op.hadOld {
			w.retire(op.oldBlob.off, op.oldBlob.size, v)
			retired += op.oldBlob.size
			if !op.oldBlob.deleted() {
				dEntries--
				dLive -= int64(op.oldBlob.size)
			}
		}
		if op.isDelete {
			w.markers = append(w.markers, marker{slot: op.slot, word: word, version: v, off: op.off, size: op.size})
		} else {
			dEntries++
			dLive += int64(op.size)
		}
	}
	retired += r.unlinkMarkers(v)
	tx.commitMarks()
	r.endColumns(tx)
	add64(r.data, hEntries, uint64(dEntries))
	add64(r.data, hLiveBytes, uint64(dLive))
	add64(r.data, hRetiredBytes, retired)
	store64(r.data, hAllocBytes, w.alloc.used)
	add64(r.data, hCommits, 1)
	store64(r.data, hVersion, v)
	tx.dropOps()
	w.pending++
	// Space running low (an eighth of the arena retired, three quarters of the mark table taken) or a
	// background pass not keeping up: the pass runs inline, as it does when an allocation fails.
	// Otherwise it runs off the write path: its barrier (a system call that interrupts every
	// CPU) and slot scan would land in this write's latency.
	// Writes never wake the loop (a wake-up is a system call): it polls on a timer.
	switch {
	case load64(r.data, hRetiredBytes) > r.l.arenaSize/8 || load64(r.data, hMarkEntries) > r.l.markSlots/4*3 ||
		w.pending >= reclaimInline:
		r.reclaimLocked()
	case !w.looping:
		w.looping = true
		go r.reclaimLoop()
	}
	w.dirty.Store(true)
}

func (w *writer) retire(off, size, version uint64) {
	w.retired = append(w.retired, retiredBlob{off: off, size: size, version: version})
}

// unlinkMarkers turns the index words of deletion markers that every reader has seen (version
// at or below the horizon) into tombstones, retiring the markers at version v. Readers that
// still hold a marker pinned a version below v, so it is freed only after they move on.
func (r *Region) unlinkMarkers(v uint64) (retired uint64) {
	w := r.w
	h := w.safe
	n := 0
	for _, m := range w.markers {
		if m.version > h {
			break
		}
		n++
		// A later write replaced the marker (and retired it) unless the word still points at a
		// deletion marker of the same version. The version check matters: the marker's memory
		// may since have been reused for a new value of the same key, with the same word.
		if load64(r.index, m.slot*8) != m.word || load64(r.arena, m.off+bVersion) != m.version ||
			load64(r.arena, m.off+bMeta)>>48 != flagDeleted {
			continue
		}
		store64(r.index, m.slot*8, tombstone)
		w.tombs++
		w.retire(m.off, m.size, v)
		retired += m.size
	}
	w.markers = append(w.markers[:0], w.markers[n:]...)
	if w.tombs >= max(r.l.indexSlots/16, 1) {
		r.sweepTombstones()
	}
	return retired
}

// reclaimLocked frees retired blobs that no pinned reader can reach, clearing the slots of dead
// processes on the way. It runs with the writer lock held, all three steps at once (the inline
// pass: when an allocation fails, and Reclaim); reclaimBackground runs the same steps with the
// barrier outside the lock.
//
// The horizon protocol: the pass first raises the horizon to the current version G, then reads
// every slot. A reader pins by storing its version and then loading the horizon; with
// sequentially consistent atomics either the pass sees the pin, or the reader sees the raised
// horizon and re-pins at a version at least G. So no blob retired above the smallest pin seen
// (or above G) can be in use, and the pass then lowers the horizon to that bound, below which
// snapshots can no longer be pinned.
func (r *Region) reclaimLocked() {
	prev, _ := r.reclaimBegin()
	if !r.reclaimBarrier(prev) {
		return
	}
	r.reclaimFinish()
}

// reclaimBegin is a pass's first step, under the writer lock: mark the pass in flight and raise
// the horizon to the current version. It returns the horizon to restore if the barrier fails,
// and whether it took over a background pass waiting for its barrier.
func (r *Region) reclaimBegin() (prevHorizon uint64, tookOver bool) {
	w := r.w
	w.pending = 0
	w.pass++
	if w.passing {
		// A background pass raised the horizon and waits for its barrier: this pass takes it
		// over (the barrier below orders its raise as well), and that one stops.
		w.passing = false
		store64(r.data, hHorizon, load64(r.data, hVersion))
		return w.safe, true
	}
	add64(r.data, hReclaimSeq, 1) // odd: pass in flight
	prevHorizon = load64(r.data, hHorizon)
	store64(r.data, hHorizon, load64(r.data, hVersion))
	return prevHorizon, false
}

// reclaimBarrier orders the readers' relaxed pin stores before the scan (regions created for
// membarrier); if the barrier fails it restores prevHorizon, ends the pass and reports false:
// without it a relaxed pin may be invisible to the scan, so nothing is freed.
func (r *Region) reclaimBarrier(prevHorizon uint64) bool {
	if r.l.flags&flagMembarrier != 0 && r.w.barrier() != nil {
		store64(r.data, hHorizon, prevHorizon)
		add64(r.data, hReclaimSeq, 1)
		return false
	}
	return true
}

// reclaimFinish is a pass's last step, under the writer lock: scan the slots, free what no pin
// can reach, lower the horizon to the bound and end the pass.
func (r *Region) reclaimFinish() {
	w := r.w
	bound := load64(r.data, hHorizon)
	now := time.Now()
	w.lastBound = PinInfo{}
	hw := min(load64(r.readers, rHighWater), r.l.readerSlots)
	for i := uint64(0); i < hw; i++ {
		s := slotOff(i)
		owner := load64(r.readers, s+slotOwner)
		if owner == 0 {
			continue
		}
		if !r.slotAlive(s, owner, now, false) {
			continue
		}
		pin := load64(r.readers, s+slotPin)
		r.observePin(s, pin, now)
		if pin != 0 && pin < bound {
			bound = pin
			w.lastBound = r.pinInfo(i, pin, now)
		}
	}
	var freed uint64
	n := 0
	for _, b := range w.retired {
		if b.version > bound {
			break
		}
		zero(r.arena[b.off : b.off+b.size])
		w.alloc.release(b.off, b.size)
		freed += b.size
		n++
	}
	w.retired = append(w.retired[:0], w.retired[n:]...)
	r.reclaimColumns(bound)
	if freed > 0 {
		add64(r.data, hRetiredBytes, -freed)
		add64(r.data, hReclaimed, freed)
		store64(r.data, hAllocBytes, w.alloc.used)
	}
	r.reclaimMarks(bound)
	store64(r.data, hHorizon, bound)
	w.safe = bound
	add64(r.data, hReclaimSeq, 1) // even: pass done
}

// reclaimLoop runs background passes while the region is open: every reclaimTick while
// commits come, backing off to reclaimIdle while none do.
func (r *Region) reclaimLoop() {
	for d := reclaimTick; !r.closed.Load(); {
		time.Sleep(d)
		if r.w.dirty.Swap(false) {
			r.reclaimBackground()
			d = reclaimTick
		} else {
			d = min(2*d, reclaimIdle)
		}
	}
}

// reclaimBackground is the loop's pass: its first and last steps under the writer lock, the
// barrier between them outside it, so writes go on meanwhile (they publish versions above the
// raised horizon, whose retired blobs this pass leaves alone). An inline pass that runs
// meanwhile takes it over; Close ends it.
func (r *Region) reclaimBackground() {
	w := r.w
	w.mu.Lock()
	if r.closed.Load() {
		w.mu.Unlock()
		return
	}
	prev, _ := r.reclaimBegin()
	w.passing = true
	pass, barrier := w.pass, w.barrier
	w.mu.Unlock()

	barrierOK := r.l.flags&flagMembarrier == 0 || barrier() == nil

	w.mu.Lock()
	defer w.mu.Unlock()
	if r.closed.Load() || w.pass != pass || !w.passing {
		return // closed (nothing to touch), or an inline pass took it over and finished it
	}
	w.passing = false
	if !barrierOK {
		store64(r.data, hHorizon, prev)
		add64(r.data, hReclaimSeq, 1)
		return
	}
	r.reclaimFinish()
}

// slotAlive checks the claimer of slot s (owner word owner) and clears the slot if its
// claimer is gone; fresh skips the liveness cache. Slots of this Region and slots being
// cleared count as alive.
func (r *Region) slotAlive(s, owner uint64, now time.Time, fresh bool) bool {
	w := r.w
	if owner == r.me || owner == clearingWord {
		return true
	}
	if !fresh && now.Sub(w.liveness[owner]) <= livenessEvery {
		return true
	}
	if slotHeld(r.files[1], s) {
		w.liveness[owner] = now
		return true
	}
	r.clearSlot(s, owner)
	delete(w.liveness, owner)
	return false
}

// observePin records in the slot when the owner first saw its current pin, so every process
// can tell a pin's age (Stats.OldestPin).
func (r *Region) observePin(s, pin uint64, now time.Time) {
	if pin == 0 {
		return
	}
	if load64(r.readers, s+slotSeenPin) != pin || load64(r.readers, s+slotSeenSince) == 0 {
		store64(r.readers, s+slotSeenSince, uint64(now.UnixNano()))
		store64(r.readers, s+slotSeenPin, pin)
	}
}

// clearSlot frees the slot of a claimer that is gone. The owner word goes to clearingWord
// first, so no new claimer can take the slot (and pin) before its pin is cleared.
func (r *Region) clearSlot(s, owner uint64) {
	if !cas64(r.readers, s+slotOwner, owner, clearingWord) {
		return
	}
	store64(r.readers, s+slotPin, 0)
	store64(r.readers, s+slotSeenPin, 0)
	store64(r.readers, s+slotSeenSince, 0)
	store64(r.readers, s+slotPID, 0)
	store64(r.readers, s+slotOwner, 0)
	add64(r.data, hDeadCleared, 1)
}

// Reclaim runs a reclamation pass now, and unlinks deletion markers every reader has seen (which
// takes a commit of its own). The owner runs passes on its own as it writes; call Reclaim when
// writes stop but memory should still be returned, or in tests.
func (r *Region) Reclaim() error {
	w := r.w
	if w == nil {
		return ErrReadOnly
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if r.closed.Load() {
		return ErrClosed
	}
	r.reclaimLocked()
	if (len(w.markers) > 0 && w.markers[0].version <= w.safe) || len(w.markRetired) > 0 {
		// A commit unlinks markers, and lets reclaimed mark entries be reused once every pin
		// passes it.
		r.commit(&Tx{r: r, version: load64(r.data, hVersion) + 1})
		r.reclaimLocked()
	}
	return nil
}

// SweepReaders clears the reader slots of every process that has ended (its lease is gone),
// checking each claimed slot now, and returns how many it cleared. The owner calls it when a
// client disconnects and periodically, so a killed worker's slots are freed within a second
// whether or not anything is written. Owner only.
func (r *Region) SweepReaders() (int, error) {
	w := r.w
	if w == nil {
		return 0, ErrReadOnly
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if r.closed.Load() {
		return 0, ErrClosed
	}
	now := time.Now()
	cleared := 0
	for i := uint64(0); i < min(load64(r.readers, rHighWater), r.l.readerSlots); i++ {
		s := slotOff(i)
		owner := load64(r.readers, s+slotOwner)
		if owner == 0 {
			continue
		}
		if r.slotAlive(s, owner, now, true) {
			r.observePin(s, load64(r.readers, s+slotPin), now)
		} else {
			cleared++
		}
	}
	return cleared, nil
}

// arenaFull is the ErrRegionFull of an allocation that failed after a reclamation pass: how
// full the arena is, what holds it, and what to do.
func (r *Region) arenaFull(size uint64, isDelete bool) error {
	w := r.w
	retired := load64(r.data, hRetiredBytes)
	msg := fmt.Sprintf("arena: no %d free bytes (%d of %d in use: %d live, %d retired, %d reserved for deletions)",
		size, w.alloc.used, r.l.arenaSize, load64(r.data, hLiveBytes), retired, r.l.deleteRes)
	if isDelete {
		msg += "; even the deletion reserve is used up"
	}
	if retired > 0 && w.lastBound.Version != 0 {
		return fmt.Errorf("%w: %s; the retired bytes wait for %v: that process is stuck or holds a snapshot open; end it (its slots are freed within a second) or close its snapshot",
			ErrRegionFull, msg, w.lastBound)
	}
	return fmt.Errorf("%w: %s; delete values or raise Config.ArenaBytes", ErrRegionFull, msg)
}

// indexFull is the ErrRegionFull of a key whose probe path has no free word: how full the
// index is and, if deletions still hold words because a reader's pin keeps them, which reader.
func (r *Region) indexFull() error {
	used, tombs := r.indexUse()
	msg := fmt.Sprintf("index: no free word within %d probes of the key's hash (%d of %d words in use, %d of them reclaimed deletions)",
		r.l.maxProbe, used, r.l.indexSlots, tombs)
	if w := r.w; len(w.markers) > 0 {
		r.reclaimLocked() // see who holds the horizon now
		if w.lastBound.Version != 0 {
			return fmt.Errorf("%w: %s; %d deleted keys keep their words until %v moves on: that process is stuck or holds a snapshot open; end it (its slots are freed within a second) or close its snapshot",
				ErrRegionFull, msg, len(w.markers), w.lastBound)
		}
	}
	return fmt.Errorf("%w: %s; raise Config.IndexSlots", ErrRegionFull, msg)
}

// indexUse counts the index words in use and the tombstones among them (error path only).
func (r *Region) indexUse() (used, tombs uint64) {
	for i := uint64(0); i < r.l.indexSlots; i++ {
		switch load64(r.index, i*8) {
		case 0:
		case tombstone:
			used++
			tombs++
		default:
			used++
		}
	}
	return used, tombs
}

func zero(b []byte) { clear(b) }
