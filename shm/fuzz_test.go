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
// panic, and whatever it accepts must describe sections inside the file. With reseal set, the
// column pool's four header words are set to the fuzzed values and the checksum recomputed, so
// the pool's geometry checks are explored past the checksum.
func FuzzParseHeader(f *testing.F) {
	h := validHeader()
	l := computeLayout(64, 64, 64<<10, 4, 64)
	f.Add(h, l.totalSize, false, uint64(0), uint64(0), uint64(0), uint64(0))
	f.Add(h[:100], uint64(100), false, uint64(0), uint64(0), uint64(0), uint64(0))
	f.Add(make([]byte, headerSize), uint64(headerSize), false, uint64(0), uint64(0), uint64(0), uint64(0))
	lp := l.withPool(3, 5, 128)
	hp := make([]byte, headerSize)
	writeHeader(hp, lp, 42, 7, nil)
	f.Add(hp, lp.totalSize, false, uint64(0), uint64(0), uint64(0), uint64(0))
	f.Add(hp, l.totalSize, false, uint64(0), uint64(0), uint64(0), uint64(0))
	f.Add(h, lp.totalSize, true, lp.poolOff, lp.columns, lp.columnCells, lp.cellBytes)
	f.Add(h, lp.totalSize, true, lp.poolOff, lp.columns+1<<62, lp.columnCells, lp.cellBytes)
	f.Fuzz(func(t *testing.T, b []byte, size uint64, reseal bool, poolOff, columns, cells, cellBytes uint64) {
		if reseal && len(b) >= headerSize {
			b = append([]byte(nil), b...)
			le := binary.LittleEndian
			le.PutUint64(b[hPoolOff:], poolOff)
			le.PutUint64(b[hColumns:], columns)
			le.PutUint64(b[hColumnCells:], cells)
			le.PutUint64(b[hCellBytes:], cellBytes)
			le.PutUint64(b[hChecksum:], uint64(headerChecksum(b)))
		}
		got, err := parseHeader(b, size)
		if err != nil {
			return
		}
		end := got.arenaOff + got.arenaSize
		if got.indexOff+8*got.indexSlots > got.markOff || got.markOff+markEntry*got.markSlots > got.arenaOff || got.totalSize != size || end > size {
			t.Fatalf("accepted a layout outside the file: %+v size %d", got, size)
		}
		if got.columns == 0 {
			if end != size || got.poolOff|got.columnCells|got.cellBytes != 0 {
				t.Fatalf("accepted a pool-less layout that does not end at the arena: %+v size %d", got, size)
			}
			return
		}
		// The pool: after the arena, aligned, in range, ending the file, its size computed
		// without overflow (each factor below 2^36, their product at most maxPoolBytes).
		if got.poolOff < end || got.poolOff%poolAlign != 0 || got.cellBytes%cellAlign != 0 || got.cellBytes == 0 || got.columnCells == 0 ||
			got.columns > maxColumns || got.cellBytes > maxPoolBytes || got.columnCells > maxPoolBytes || got.poolBytes() > maxPoolBytes ||
			got.poolBytes()/got.cellBytes/got.columnCells != got.columns || got.poolOff+got.poolBytes() != size {
			t.Fatalf("accepted a column pool outside the file: %+v size %d", got, size)
		}
		// Every cell's bytes lie inside the pool.
		p := ColumnPool{&columnPool{bytes: make([]byte, 0), columns: got.columns, cells: got.columnCells, cellBytes: got.cellBytes}}
		if c, n, cb := p.Geometry(); c != int(got.columns) || n != int(got.columnCells) || cb != int(got.cellBytes) {
			t.Fatalf("geometry %d %d %d of %+v", c, n, cb, got)
		}
		lastOff := ((got.columnCells-1)*got.columns + got.columns - 1) * got.cellBytes
		if lastOff+got.cellBytes != got.poolBytes() {
			t.Fatalf("last cell at %d of %d bytes ends past the pool of %d", lastOff, got.cellBytes, got.poolBytes())
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
