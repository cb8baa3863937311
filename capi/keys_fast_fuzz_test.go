//go:build cgo && linux

package main

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/shmsteer/shmsteer/internal/shmlayout"
)

// Offsets of the fuzz target's descriptor, taken from the generated header's values through
// shm's table (internal/shmlayout): the test builds a descriptor by hand.
const (
	fzState, fzPin, fzVersion, fzHorizon, fzIndex, fzMask = 0, 8, 16, 24, 32, 40
	fzArena, fzArenaSize, fzMaxProbe, fzK1, fzRelaxed     = 48, 56, 64, 72, 80
	fzK0, fzK2, fzSeeds                                   = 88, 96, 128
	fzIndexSlots                                          = 512 // one page of index words
	fzArenaBytes                                          = 2 * 4096
)

// fuzzMapping maps pages with PROT_NONE guards on both sides of the index and of the arena, so
// a read outside them faults and fails the fuzz run: [guard][index][guard][arena][guard].
type fuzzMapping struct {
	all, index, arena, desc []byte
}

func newFuzzMapping(t testing.TB) *fuzzMapping {
	pg := 4096
	all, err := unix.Mmap(-1, 0, 3*pg+fzArenaBytes+pg, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	m := &fuzzMapping{all: all, index: all[pg : 2*pg], arena: all[3*pg : 3*pg+fzArenaBytes]}
	for _, b := range [][]byte{m.index, m.arena} {
		if err := unix.Mprotect(b, unix.PROT_READ|unix.PROT_WRITE); err != nil {
			t.Fatal(err)
		}
	}
	if m.desc, err = unix.Mmap(-1, 0, pg, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS); err != nil {
		t.Fatal(err)
	}
	return m
}

func addr(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

// FuzzFastReader: the C reader on arbitrary mapping bytes (index words, blob headers, keys and
// lengths the fuzzer picks, some aimed at the key's probe sequence with forged matching
// headers) never reads outside the index or the arena (guard pages fault), releases its pin,
// and answers only a value inside the arena whose blob holds the key.
func FuzzFastReader(f *testing.F) {
	f.Add(uint16(1), []byte("req-1"), uint8(8), uint64(5), []byte{1, 0, 0, 0, 1, 2, 3}, []byte{0})
	f.Add(uint16(1), bytes.Repeat([]byte("k"), 40), uint8(64), uint64(1), bytes.Repeat([]byte{0xff, 1, 0, 0, 0, 0, 0, 0}, 64), []byte{3, 1, 7})
	f.Add(uint16(63), []byte("x"), uint8(255), ^uint64(0), bytes.Repeat([]byte{0x41}, 900), []byte{255, 254, 0, 1})
	// A well-formed blob at arena offset 128 (unit 2, the aim byte 1's): one unit, value of 3
	// bytes at its offset 48, version 1; the aim forges its kind, key length and key.
	blob := forgedBlob()
	f.Add(uint16(1), []byte("req-1"), uint8(8), uint64(5), blob, []byte{1})
	m := newFuzzMapping(f)
	f.Fuzz(func(t *testing.T, kind uint16, key []byte, probe uint8, version uint64, data, aims []byte) {
		fastFindOnce(t, m, kind, key, probe, version, data, aims)
	})
}

func forgedBlob() []byte {
	blob := make([]byte, 128+64)
	binary.LittleEndian.PutUint64(blob[128:], 1)
	binary.LittleEndian.PutUint64(blob[136:], 3<<32)
	binary.LittleEndian.PutUint64(blob[144:], 1)
	binary.LittleEndian.PutUint64(blob[160:], 48<<32)
	copy(blob[128+48:], "abc")
	return blob
}

// The forged seed is answered (the fuzz target reaches the copy-out path), and the same bytes
// at a pinned version below the blob's, or with the deleted flag, are left to Go.
func TestFastReaderForgedBlob(t *testing.T) {
	m := newFuzzMapping(t)
	off, n, ok := fastFindOnce(t, m, 1, []byte("req-1"), 8, 5, forgedBlob(), []byte{1})
	if !ok || off != 128+48 || n != 3 || string(m.arena[off:off+n]) != "abc" {
		t.Fatalf("forged blob: ok %v, value at %d, %d bytes", ok, off, n)
	}
	if _, _, ok := fastFindOnce(t, m, 1, []byte("req-1"), 8, 0, forgedBlob(), []byte{1}); ok {
		t.Fatal("answered a blob above the pinned version")
	}
	del := forgedBlob()
	binary.LittleEndian.PutUint64(del[128:], 1|1<<48)
	if _, _, ok := fastFindOnce(t, m, 1, []byte("req-1"), 8, 5, del, []byte{1}); ok {
		t.Fatal("answered a deletion marker")
	}
	if _, _, ok := fastFindOnce(t, m, 1, []byte("req-2"), 8, 5, forgedBlob(), []byte{0}); ok {
		t.Fatal("answered a blob of another key")
	}
}

// fastFindOnce lays out one fuzz case in m and runs the C reader on it, checking what it read.
func fastFindOnce(t *testing.T, m *fuzzMapping, kind uint16, key []byte, probe uint8, version uint64, data, aims []byte) (uint64, uint64, bool) {
	t.Helper()
	le := binary.LittleEndian
	clear(m.index)
	clear(m.arena)
	clear(m.desc)
	n := copy(m.arena, data)
	for i := 0; i+8 <= len(data)-n && i < len(m.index); i += 8 { // the rest of data: index words
		copy(m.index[i:], data[n+i:n+i+8])
	}
	seed, k0, k1, k2 := uint64(0x9e3779b97f4a7c15)*uint64(kind|1), uint64(0x452821e638d01377), uint64(0x243f6a8885a308d3), uint64(0x13198a2e03707344)
	d := m.desc
	le.PutUint64(d[fzK0:], k0)
	le.PutUint64(d[fzK1:], k1)
	le.PutUint64(d[fzK2:], k2)
	if kind < 64 {
		le.PutUint64(d[fzSeeds+8*int(kind):], seed)
	}
	h := fastHash(uintptr(addr(d)), kind, key)
	// Each aim byte forges one index word on the probe sequence: fingerprint right, unit
	// from the byte, and (odd bytes) a blob header there naming this kind and key.
	for j, a := range aims {
		unit := uint64(a) * 2 % (fzArenaBytes / 64)
		le.PutUint64(m.index[((h+uint64(j))%fzIndexSlots)*8:], h>>32<<32|(unit+1))
		if off := unit * 64; a&1 == 1 && off+40+uint64(len(key)) <= fzArenaBytes {
			meta := le.Uint64(m.arena[off:])&^(0xffff<<32) | uint64(kind)<<32
			le.PutUint64(m.arena[off:], meta)
			lens := le.Uint64(m.arena[off+8:])&^0xffffffff | uint64(len(key))
			le.PutUint64(m.arena[off+8:], lens)
			copy(m.arena[off+40:], key)
		}
	}
	pin := d[2048:]
	le.PutUint64(d[1024:], version)
	le.PutUint64(d[fzPin:], addr(pin))
	le.PutUint64(d[fzVersion:], addr(d[1024:]))
	le.PutUint64(d[fzHorizon:], addr(d[1088:]))
	le.PutUint64(d[fzIndex:], addr(m.index))
	le.PutUint64(d[fzMask:], fzIndexSlots-1)
	le.PutUint64(d[fzArena:], addr(m.arena))
	le.PutUint64(d[fzArenaSize:], fzArenaBytes)
	le.PutUint64(d[fzMaxProbe:], uint64(probe))
	le.PutUint64(d[fzRelaxed:], uint64(probe&1))
	off, vl, ok := fastFind(uintptr(addr(d)), kind, key)
	if p := le.Uint64(pin); p != 0 {
		t.Fatalf("pin left at %d", p)
	}
	if !ok {
		return 0, 0, false
	}
	if off > fzArenaBytes || vl > fzArenaBytes-off {
		t.Fatalf("value [%d, +%d) outside the %d-byte arena", off, vl, fzArenaBytes)
	}
	found := false
	for u := uint64(0); u*64+40+uint64(len(key)) <= off; u++ {
		b := m.arena[u*64:]
		if le.Uint64(b[8:])&0xffffffff == uint64(len(key)) && bytes.Equal(b[40:40+len(key)], key) && u*64+le.Uint64(b[32:])>>32 == off {
			found = true
		}
	}
	if !found {
		t.Fatalf("answered a value at %d that no blob holding the key points to", off)
	}
	return off, vl, true
}

// fastHashAgrees checks the C reader's hash of (kind 1, key), the key placed at every
// alignment of a buffer, against the layout's reference (shm's TestKeyHashReference holds the
// Go reader to the same).
func fastHashAgrees(t *testing.T, desc []byte, seed, k1, k2 uint64, key []byte) {
	t.Helper()
	le := binary.LittleEndian
	le.PutUint64(desc[fzSeeds+8:], seed)
	le.PutUint64(desc[fzK1:], k1)
	le.PutUint64(desc[fzK2:], k2)
	want := shmlayout.RefKeyHash(seed, k1, k2, key)
	buf := make([]byte, len(key)+8)
	for shift := range 8 {
		k := buf[shift : shift+len(key)]
		copy(k, key)
		if got := fastHash(uintptr(addr(desc)), 1, k); got != want {
			t.Fatalf("len %d at offset %d: C hash %#x, reference %#x", len(key), shift, got, want)
		}
	}
}

// Every key length from 0 to the longest key, at every alignment, hashes in C as the
// reference does.
func TestFastHashReference(t *testing.T) {
	m := newFuzzMapping(t)
	rng := rand.New(rand.NewPCG(3, 4))
	key := make([]byte, 1024)
	for i := range key {
		key[i] = byte(rng.Uint32())
	}
	for n := 0; n <= len(key); n++ {
		fastHashAgrees(t, m.desc, rng.Uint64(), rng.Uint64(), rng.Uint64(), key[:n])
	}
}

// FuzzFastHash: arbitrary secrets and keys (cut to the longest key) hash in C as the
// reference does.
func FuzzFastHash(f *testing.F) {
	f.Add(uint64(1), uint64(2), uint64(3), []byte("0c6a1f52-9e1b-4d3a-8b2e-61f0a4c2d9e7"))
	f.Add(uint64(0), uint64(0), uint64(0), []byte{})
	f.Add(^uint64(0), uint64(1)<<63, uint64(7), []byte("abc"))
	m := newFuzzMapping(f)
	f.Fuzz(func(t *testing.T, seed, k1, k2 uint64, key []byte) {
		fastHashAgrees(t, m.desc, seed, k1, k2, key[:min(len(key), 1024)])
	})
}
