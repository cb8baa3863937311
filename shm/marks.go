package shm

// Marks: keys without values, for a few bytes each.
//
// The key registry revokes a key by deleting its value and leaving a sentinel that readers see
// as "revoked" rather than "missing" until a grace period ends; at 5,000 revocations a second
// and a 60 s grace that is 300,000 sentinels standing at once. A blob per sentinel (header,
// key, alignment: 128 bytes, and an index word) would crowd the arena and the index that live
// values need. So sentinels live apart, in the mark table: open addressing over 32-byte
// entries {tag, added version, removed version, 0}, where tag is a 64-bit keyed hash of (kind,
// key) that never takes the values 0 (empty) or markTomb (reclaimed).
//
// Versions make marks snapshot-consistent: a reader pinned at v sees a mark iff added <= v and
// (removed == 0 or removed > v). The owner fills an entry's versions before its tag, so a
// reader that loads a tag and then the versions (sequentially consistent atomics) sees a whole
// entry, and it re-loads the tag afterwards: a change means the entry was reclaimed meanwhile,
// which only happens to entries that no pinned reader can see (removed <= every pin), so the
// reader moves on. A reclaimed entry (markTomb) is reused only after a later pass finds every
// pin at or above the version published after the reclaim, so no probe that could have read
// the old entry is still running: an entry never changes identity under a reader.
//
// A tag identifies a key only up to its 64-bit hash: an id that was never marked but hashes
// like a marked one would read as marked instead of not found (about one chance in 2^64 per
// mark present per lookup).

import "fmt"

const (
	markSalt0 = 0x6d61726b73000001 // "marks", keeps mark tags apart from index hashes
	markSalt1 = 0x6d61726b73000002
)

func (r *Region) markTag(kind Kind, key []byte) uint64 {
	t := keyHash(r.l.hashK0^markSalt0, r.l.hashK1^markSalt1, uint64(kind), key) | 1
	if t == markTomb {
		t = 1
	}
	return t
}

func (r *Region) markOff(pos uint64) uint64 { return pos * markEntry }

// marked reports whether (kind, key) carries a mark visible at version v.
func (r *Region) marked(kind Kind, key []byte, v uint64) bool {
	if kind == 0 || len(key) == 0 || len(key) > MaxKeyLen || load64(r.data, hMarkEntries) == 0 {
		return false
	}
	t := r.markTag(kind, key)
	mask := r.l.markSlots - 1
	for i := uint64(0); i < maxMarkProbe; i++ {
		o := r.markOff((t + i) & mask)
		tag := load64(r.marks, o+markTag)
		if tag == 0 {
			return false
		}
		if tag != t {
			continue
		}
		added, removed := load64(r.marks, o+markAdded), load64(r.marks, o+markRemoved)
		if load64(r.marks, o+markTag) != t {
			continue // reclaimed under us: it was invisible to this reader anyway
		}
		if added <= v && (removed == 0 || removed > v) {
			return true
		}
	}
	return false
}

// notFound is the error for a lookup that found no value: ErrMarked if the key is marked.
func (r *Region) notFound(kind Kind, key []byte, v uint64) error {
	if r.marked(kind, key, v) {
		return ErrMarked
	}
	return ErrNotFound
}

// Marked reports whether (kind, key) carries a mark at the current version.
func (r *Region) Marked(kind Kind, key string) (bool, error) {
	slot, v, err := r.pinCurrent()
	if err != nil {
		return false, err
	}
	ok := r.marked(kind, stringBytes(key), v)
	r.unpin(slot)
	return ok, nil
}

// markOp is a mark change planned by a Tx, undone on abort.
type markOp struct {
	pos    uint64
	insert bool // a new entry (else removed was set on a present one)
}

// Mark marks (kind, key) from this Tx's version on; a no-op if it is marked already. A mark
// needs no arena space: it fits when the region is full of values, so a revocation always
// goes through (ErrRegionFull only when the mark table itself is full).
func (tx *Tx) Mark(kind Kind, key string) error {
	r := tx.r
	if err := checkKey(kind, key); err != nil {
		return err
	}
	t := r.markTag(kind, stringBytes(key))
	mask := r.l.markSlots - 1
	free := int64(-1)
	for i := uint64(0); i < maxMarkProbe; i++ {
		pos := (t + i) & mask
		o := r.markOff(pos)
		tag := load64(r.marks, o+markTag)
		if tag == 0 || (tag == markTomb && r.w.markFree[pos]) {
			if free < 0 {
				free = int64(pos)
			}
			if tag == 0 {
				break
			}
			continue
		}
		if tag == t && load64(r.marks, o+markRemoved) == 0 {
			return nil // present (perhaps marked earlier in this Tx)
		}
	}
	if free < 0 {
		w := r.w
		msg := fmt.Sprintf("mark table: no free entry within %d probes (%d of %d entries in use, %d marks present)",
			maxMarkProbe, load64(r.data, hMarkEntries), r.l.markSlots, load64(r.data, hMarks)+uint64(w.pendingMarks(tx)))
		if waiting := len(w.markRemoved) + len(w.markRetired); waiting > 0 {
			r.reclaimLocked() // see who holds the horizon now
			if w.lastBound.Version != 0 {
				return fmt.Errorf("%w: %s; %d removed marks keep their entries until %v moves on: that process is stuck or holds a snapshot open; end it or close its snapshot",
					ErrRegionFull, msg, waiting, w.lastBound)
			}
		}
		return fmt.Errorf("%w: %s; raise Config.MarkSlots", ErrRegionFull, msg)
	}
	pos := uint64(free)
	o := r.markOff(pos)
	if load64(r.marks, o+markTag) == 0 {
		add64(r.data, hMarkEntries, 1)
	} else {
		delete(r.w.markFree, pos)
	}
	store64(r.marks, o+markAdded, tx.version)
	store64(r.marks, o+markRemoved, 0)
	store64(r.marks, o+markTag, t) // last: a reader that sees the tag sees the versions
	tx.marks = append(tx.marks, markOp{pos: pos, insert: true})
	return nil
}

// Unmark removes the mark of (kind, key) from this Tx's version on; a no-op if there is none.
func (tx *Tx) Unmark(kind Kind, key string) error {
	r := tx.r
	if err := checkKey(kind, key); err != nil {
		return err
	}
	if load64(r.data, hMarkEntries) == 0 {
		return nil
	}
	t := r.markTag(kind, stringBytes(key))
	mask := r.l.markSlots - 1
	for i := uint64(0); i < maxMarkProbe; i++ {
		pos := (t + i) & mask
		o := r.markOff(pos)
		tag := load64(r.marks, o+markTag)
		if tag == 0 {
			return nil
		}
		if tag != t || load64(r.marks, o+markRemoved) != 0 {
			continue
		}
		store64(r.marks, o+markRemoved, tx.version)
		tx.marks = append(tx.marks, markOp{pos: pos})
		return nil
	}
	return nil
}

func checkKey(kind Kind, key string) error {
	if kind == 0 {
		return ErrBadKind
	}
	if len(key) == 0 || len(key) > MaxKeyLen {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrKeyTooLong, len(key), MaxKeyLen)
	}
	return nil
}

// pendingMarks counts the marks a Tx inserted so far (for error messages).
func (w *writer) pendingMarks(tx *Tx) int {
	n := 0
	for _, m := range tx.marks {
		if m.insert {
			n++
		}
	}
	return n
}

// abortMarks undoes a Tx's mark changes; none was published, so no reader relies on them.
func (tx *Tx) abortMarks() {
	r := tx.r
	for _, m := range tx.marks {
		o := r.markOff(m.pos)
		if m.insert {
			store64(r.marks, o+markTag, markTomb)
			r.w.retireMark(m.pos, load64(r.data, hVersion)+1)
		} else {
			store64(r.marks, o+markRemoved, 0)
		}
	}
	tx.marks = nil
}

// commitMarks records a committed Tx's mark changes in the owner's bookkeeping.
func (tx *Tx) commitMarks() {
	w := tx.r.w
	var d int64
	for _, m := range tx.marks {
		o := tx.r.markOff(m.pos)
		if m.insert {
			if load64(tx.r.marks, o+markRemoved) == 0 {
				d++
			} else { // marked and unmarked in this Tx
				w.markRemoved = append(w.markRemoved, markRef{pos: m.pos, version: tx.version})
			}
			continue
		}
		if load64(tx.r.marks, o+markAdded) != tx.version {
			d--
		}
		w.markRemoved = append(w.markRemoved, markRef{pos: m.pos, version: tx.version})
	}
	add64(tx.r.data, hMarks, uint64(d))
	tx.marks = nil
}

type markRef struct{ pos, version uint64 }

func (w *writer) retireMark(pos, version uint64) {
	w.markRetired = append(w.markRetired, markRef{pos: pos, version: version})
}

// reclaimMarks, in a reclamation pass with every pin at or above bound: entries removed at or
// below bound are invisible to every reader now and later, so they become tombstones; and
// tombstones retired at or below bound can take new marks.
func (r *Region) reclaimMarks(bound uint64) {
	w := r.w
	next := load64(r.data, hVersion) + 1
	n := 0
	for _, m := range w.markRemoved {
		if m.version > bound {
			break
		}
		n++
		store64(r.marks, r.markOff(m.pos)+markTag, markTomb)
		w.retireMark(m.pos, next)
	}
	w.markRemoved = append(w.markRemoved[:0], w.markRemoved[n:]...)
	n = 0
	for _, m := range w.markRetired {
		if m.version > bound {
			break
		}
		n++
		w.markFree[m.pos] = true
		r.emptyTombs(m.pos)
	}
	w.markRetired = append(w.markRetired[:0], w.markRetired[n:]...)
	if n > 0 && uint64(len(w.markFree)) == load64(r.data, hMarkEntries) {
		// Nothing but reusable tombstones left (a table with no empty entry never gets one
		// back by emptyTombs): empty them all.
		for pos := range w.markFree {
			store64(r.marks, r.markOff(pos)+markTag, 0)
		}
		clear(w.markFree)
		store64(r.data, hMarkEntries, 0)
	}
}

// emptyTombs turns the reusable tombstone at pos, and the reusable ones before it, back into
// empty entries when the entry after them is empty: no probe could pass through them to reach
// anything, so misses stay short. Readers probing there stop one entry earlier, with the same
// answer.
func (r *Region) emptyTombs(pos uint64) {
	w := r.w
	mask := r.l.markSlots - 1
	if load64(r.marks, r.markOff((pos+1)&mask)+markTag) != 0 {
		return
	}
	for i := uint64(0); i < r.l.markSlots && w.markFree[pos]; i++ {
		store64(r.marks, r.markOff(pos)+markTag, 0)
		delete(w.markFree, pos)
		add64(r.data, hMarkEntries, ^uint64(0))
		pos = (pos - 1) & mask
	}
}
