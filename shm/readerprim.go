package shm

import (
	"encoding/binary"
	"math/bits"
	"sync/atomic"
)

// The primitives of the one reader (reader_gen.go, generated from internal/shmlayout's
// reader.go.in, whose C translation is capi's C reader), written for Go as reader.c.in writes
// them for C. Every word of the mapping they load or store goes through sync/atomic.

// rmem is what the reader reads: the pin, header words and geometry of one reader, and the
// hash's secrets. Its fields are the reader descriptor's rows (internal/shmlayout, dF for field
// f; fillDesc writes one from it), so the generated reader names the same words in Go and in C.
// A Region holds one without a pin word (for Region.Get, which pins elsewhere); each Reader
// holds a copy with its own.
type rmem struct {
	pin, version, horizon *uint64
	state                 *uint64 // the Reader's state word: its descriptor's, else ownState
	index                 []uint64
	indexMask             uint64
	arena                 []byte
	arenaWords            []uint64 // arena as words: Go's view for blobAt, no descriptor row
	arenaSize, maxProbe   uint64
	hashK0, hashK1        uint64 // the region's salt
	hashK2                uint64 // hashK2(hashK0, hashK1)
	relaxed               uint64 // 1: pins may be plain stores (the owner fences with membarrier)
	seeds                 [seededKinds]uint64
	ownState              uint64 // the state word of a Reader without a descriptor
}

// closedMem is what a Reader of a closed region reads instead of the unmapped region: no
// version (0) behind a horizon of 1, so a pin never succeeds, a state word that says closed,
// and an empty index and arena.
func closedMem() *rmem {
	w := make([]uint64, 3)
	w[2] = 1
	m := &rmem{pin: &w[0], version: &w[1], horizon: &w[2], ownState: descClosed}
	m.state = &m.ownState
	return m
}

func ldWord(p *uint64) uint64         { return atomic.LoadUint64(p) }
func ldState(m *rmem) uint64          { return atomic.LoadUint64(m.state) }
func storeFenced(p *uint64, v uint64) { atomic.StoreUint64(p, v) }

// ldIndex loads index word i; i is masked by the index size, and Go checks it again.
func ldIndex(m *rmem, i uint64) uint64 { return atomic.LoadUint64(&m.index[i]) }

// blobAt is the header of the blob at arena offset off (8-byte aligned), checked by the caller
// (and by Go again, once for the whole header); ldHdr loads its word at byte offset field.
func blobAt(m *rmem, off uint64) []uint64 {
	w := off / 8
	return m.arenaWords[w : w+bKey/8 : w+bKey/8]
}
func ldHdr(hdr []uint64, field uint64) uint64 { return atomic.LoadUint64(&hdr[field/8]) }

// keyAt reports whether the arena's bytes at off are key.
func keyAt(m *rmem, off uint64, key []byte) bool {
	return string(m.arena[off:off+uint64(len(key))]) == string(key)
}

// le64 and le32 load the caller's key (not the mapping) little-endian at p.
func le64(key []byte, p uint64) uint64 { return binary.LittleEndian.Uint64(key[p:]) }
func le32(key []byte, p uint64) uint64 { return uint64(binary.LittleEndian.Uint32(key[p:])) }

// fold multiplies to 128 bits and xors the halves: every input bit reaches the output.
func fold(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}
