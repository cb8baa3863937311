//go:build linux

package shm

import (
	"encoding/binary"
	"testing"
)

func validHeader() []byte {
	l := computeLayout(64, 64, 64<<10, 4, 64)
	l.hashK0, l.hashK1, l.regionID = 1, 2, 3
	h := make([]byte, headerSize)
	writeHeader(h, l, 42, 7, []byte("cfg"))
	return h
}

// FuzzParseHeader feeds arbitrary header bytes and file sizes to the validator: it must never
// panic, and whatever it accepts must describe sections inside the file.
func FuzzParseHeader(f *testing.F) {
	h := validHeader()
	l := computeLayout(64, 64, 64<<10, 4, 64)
	f.Add(h, l.totalSize)
	f.Add(h[:100], uint64(100))
	f.Add(make([]byte, headerSize), uint64(headerSize))
	f.Fuzz(func(t *testing.T, b []byte, size uint64) {
		got, err := parseHeader(b, size)
		if err != nil {
			return
		}
		if got.arenaOff+got.arenaSize != size || got.indexOff+8*got.indexSlots > got.markOff || got.markOff+markEntry*got.markSlots > got.arenaOff || got.totalSize != size {
			t.Fatalf("accepted a layout outside the file: %+v size %d", got, size)
		}
	})
}

// FuzzReadBlob decodes blobs from arbitrary arena bytes at arbitrary offsets: no panic, and an
// accepted blob's key and value lie inside the arena.
func FuzzReadBlob(f *testing.F) {
	arena := make([]byte, 512)
	writeBlobHeader(arena, 64, 3, 0, []byte("key"), 5, 9, 0)
	copy(arena[64+valueOffset(3, 5):], "value")
	sealBlob(arena, 64, 3, 5)
	f.Add(arena, uint64(64))
	f.Add(arena, uint64(0))
	f.Add(arena[:100], uint64(64))
	f.Fuzz(func(t *testing.T, b []byte, off uint64) {
		arena := make([]byte, len(b)&^7) // word-aligned like the real arena
		copy(arena, b)
		if len(arena) == 0 {
			return
		}
		bl, err := readBlob(arena, off)
		if err != nil {
			return
		}
		if bl.off+bl.size > uint64(len(arena)) || bl.valueOff+bl.valueLen > bl.off+bl.size || bl.off+bKey+bl.keyLen > bl.valueOff {
			t.Fatalf("accepted blob outside its extent: %+v", bl)
		}
		_ = bl.key(arena)
		_ = bl.value(arena)
		_ = bl.verify(arena)
		_ = binary.LittleEndian.Uint64(arena[bl.off:])
	})
}
