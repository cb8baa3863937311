package shm

import "sync/atomic"

// The reader descriptor: a Reader's geometry and pin word, in process-local memory outside the
// Go heap, for the C reader that libshmsteer.so compiles from the same layout table
// (internal/shmlayout; the offsets are its d* rows). The Go reader never reads it.

// descPage holds a descriptor (its first descSize bytes): one page of its own, behind a pointer
// so that printing a Reader prints its address, not its bytes.
type descPage [4096]byte

// fillDesc writes everything the C reader needs; the state word last, so a reader that sees
// it usable sees the rest.
func (rd *Reader) fillDesc() {
	d, m, r := rd.desc[:], rd.m.Load(), rd.r
	store64(d, dPin, addrOf(r.readers, rd.slot+slotPin)) // m.pin, m.version, m.horizon
	store64(d, dVersion, addrOf(r.data, hVersion))
	store64(d, dHorizon, addrOf(r.data, hHorizon))
	store64(d, dIndex, addrOf(r.index, 0))
	store64(d, dIndexMask, m.indexMask)
	store64(d, dArena, addrOf(m.arena, 0))
	store64(d, dArenaSize, m.arenaSize)
	store64(d, dMaxProbe, m.maxProbe)
	store64(d, dHashK0, m.hashK0)
	store64(d, dHashK1, m.hashK1)
	store64(d, dHashK2, m.hashK2)
	store64(d, dRelaxed, m.relaxed)
	for k, s := range m.seeds {
		store64(d, dSeeds+8*uint64(k), s)
	}
	store64(d, dState, 0)
}

// setDescState sets or clears bits of the Reader's state word, which the generated reader's
// getAt checks in Go and in C: its descriptor's (a Reader has none when the system gave no
// memory for it; the C reader is then never used, and the word is its rmem's own).
func (rd *Reader) setDescState(bits uint64, on bool) { setState(rd.m.Load().state, bits, on) }

// setState sets or clears bits of the state word at p.
func setState(p *uint64, bits uint64, on bool) {
	for {
		old := atomic.LoadUint64(p)
		nw := old &^ bits
		if on {
			nw = old | bits
		}
		if atomic.CompareAndSwapUint64(p, old, nw) {
			return
		}
	}
}

// Descriptor returns the address of the Reader's descriptor, for the C reader of the C ABI
// (capi): process-local memory outside the Go heap, laid out as internal/shmlayout's table
// says, that stays valid until Close, and whose state word says closed from the moment the
// Reader or its Region starts closing. 0 when the Reader has none. Go code has no use for it.
func (rd *Reader) Descriptor() uintptr {
	if rd.desc == nil {
		return 0
	}
	return uintptr(addrOf(rd.desc[:], 0))
}

// A descriptor fits its page (a negative constant does not convert to uint).
const _ = uint(len(descPage{}) - descSize)
