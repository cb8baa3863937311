package main

import (
	"sync"
	"sync/atomic"
)

// maxHandles bounds the objects (clients, owners, snapshots, steppers, readers) alive at once
// in one process.
const maxHandles = 1 << 16

// handleEntry is one live object; gen tells a live handle from a stale one in the same slot.
type handleEntry struct {
	gen uint32
	val any
}

// handleTable maps the uint64 handles C holds to Go objects: slot index + 1 in the low 32 bits,
// the slot's generation in the high 32. Lookups are one atomic load (hot paths: key get, step
// apply); a closed handle's slot gets a new generation, so the stale handle finds nothing.
type handleTable struct {
	slots [maxHandles]atomic.Pointer[handleEntry]
	mu    sync.Mutex
	gens  [maxHandles]uint32
	free  []uint32
	next  uint32
}

var handles handleTable

// put stores v and returns its handle; 0 when the table is full.
func (t *handleTable) put(v any) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var i uint32
	if n := len(t.free); n > 0 {
		i, t.free = t.free[n-1], t.free[:n-1]
	} else if t.next < maxHandles {
		i = t.next
		t.next++
	} else {
		return 0
	}
	t.gens[i]++
	t.slots[i].Store(&handleEntry{gen: t.gens[i], val: v})
	return uint64(t.gens[i])<<32 | uint64(i+1)
}

// get returns the object behind h, or nil for a zero, stale or out-of-range handle.
func (t *handleTable) get(h uint64) any {
	i := uint32(h) - 1
	if i >= maxHandles {
		return nil
	}
	e := t.slots[i].Load()
	if e == nil || e.gen != uint32(h>>32) {
		return nil
	}
	return e.val
}

// remove forgets h, reporting whether it was live.
func (t *handleTable) remove(h uint64) bool {
	i := uint32(h) - 1
	if i >= maxHandles {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.slots[i].Load()
	if e == nil || e.gen != uint32(h>>32) {
		return false
	}
	t.slots[i].Store(nil)
	t.free = append(t.free, i)
	return true
}

// getAs returns the object behind h if it is a T.
func getAs[T any](h uint64) (T, bool) {
	v, ok := handles.get(h).(T)
	return v, ok
}
