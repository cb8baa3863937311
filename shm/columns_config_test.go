//go:build linux

package shm

// The column pool's configuration, its files (opening, refusing bad ones, residency) and its
// cells' float32 view; columns_test.go has the pool's lifecycle.

import (
	"encoding/binary"
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestColumnConfig(t *testing.T) {
	base := Config{IndexSlots: 64, ArenaBytes: 64 << 10, ReaderSlots: 2}
	for _, c := range []struct {
		cols, cells, bytes int
		msg                string
	}{
		{-1, 1, 64, "must not be negative"},
		{1, -1, 64, "must not be negative"},
		{1, 1, -64, "must not be negative"},
		{1, 0, 0, "set all three"},
		{0, 1, 64, "set all three"},
		{1, 1, 0, "set all three"},
		{1, 1, 100, "multiple of 64"},
		{maxColumns + 1, 1, 64, "at most"},
		{1 << 20, 1 << 20, 1 << 20, "exceeds"},
		{1, 1, 1 << 62, "exceeds"},
		{2, 1 << 30, 64, "exceeds"},
		{1 << 16, 1 << 40, 1 << 40, "exceeds"}, // the product overflows 64 bits
	} {
		cfg := base
		cfg.Columns, cfg.ColumnCells, cfg.CellBytes = c.cols, c.cells, c.bytes
		_, err := Create(cfg)
		require.ErrorIs(t, err, ErrBadConfig, "%+v", c)
		require.ErrorContains(t, err, c.msg, "%+v", c)
	}
	cfg := base
	cfg.Columns, cfg.ColumnCells, cfg.CellBytes = 3, 5, 192
	r := newTestRegion(t, cfg)
	c, n, b := r.Columns().Geometry()
	require.Equal(t, []int{3, 5, 192}, []int{c, n, b})
	require.Zero(t, r.l.poolOff%poolAlign)
	require.GreaterOrEqual(t, r.l.poolOff, r.l.arenaOff+r.l.arenaSize)
	require.Zero(t, addrOf(r.Columns().Cell(0, 0), 0)%cellAlign)
	require.Nil(t, r.Columns().Cell(3, 0))
	require.Nil(t, r.Columns().Cell(0, 5))
	require.Nil(t, r.Columns().Cell(-1, 0))
	require.Len(t, r.Columns().CellFloat32(2, 4), 48)
	require.Equal(t, addrOf(r.Columns().Cell(2, 4), 0), addrOf(Float32Bytes(r.Columns().CellFloat32(2, 4)), 0), "a view of the cell itself")
	require.Nil(t, r.Columns().CellFloat32(3, 0))
	require.Nil(t, r.Columns().CellFloat32(0, -1))
	require.Equal(t, "shm.ColumnPool{columns: 3, cells: 5, cellBytes: 192}", fmt.Sprint(r.Columns()))
}

// TestMaxColumns: MaxColumns is the boundary Create's config check draws: that many columns
// pass it, one more is ErrBadConfig, for geometries bound by the column cap, by the pool's
// bytes, and one column too large for any pool.
func TestMaxColumns(t *testing.T) {
	base := Config{IndexSlots: 64, ArenaBytes: 64 << 10, ReaderSlots: 2}
	for _, g := range []struct{ cells, bytes, want int }{
		{1, 64, maxColumns},                // the column cap
		{160, 16384, 26214},                // hidden 4096, 32 layers, 5 hooks: the pool's bytes
		{640, 65536, 1638},                 // hidden 16384, 128 layers
		{1 << 20, 1 << 16, 1},              // one column of 64 GiB
		{1<<20 + 1, 1 << 16, 0},            // one column over the pool's bytes
		{1 << 40, 1 << 40, 0},              // the product overflows 64 bits
		{0, 64, 0}, {1, 0, 0}, {-1, 64, 0}, // not a geometry
	} {
		require.Equal(t, g.want, MaxColumns(g.cells, g.bytes), "%+v", g)
		if g.want == 0 || g.cells < 1 || g.bytes < 1 {
			continue
		}
		cfg := base
		cfg.Columns, cfg.ColumnCells, cfg.CellBytes = g.want, g.cells, g.bytes
		_, err := cfg.withDefaults()
		require.NoError(t, err, "%+v", g)
		cfg.Columns++
		_, err = cfg.withDefaults()
		require.ErrorIs(t, err, ErrBadConfig, "%+v", g)
	}
	cfg := base
	cfg.Columns, cfg.ColumnCells, cfg.CellBytes = 1, 1<<20+1, 1<<16
	_, err := cfg.withDefaults()
	require.ErrorIs(t, err, ErrBadConfig, "one column over the pool's bytes")
}

// Another mapping of the two files (as another process opens them) sees the owner's geometry
// and cells; its cells are read-only.
func TestColumnsOpenFromFiles(t *testing.T) {
	r := colRegion(t, 8, 4, 512)
	putColumns(t, r, "a", 3, 21)
	putColumns(t, r, "b", 2, 22)
	o, err := Open(r.Files())
	require.NoError(t, err)
	og, oc, ob := o.Columns().Geometry()
	rg, rc, rb := r.Columns().Geometry()
	require.Equal(t, []int{rg, rc, rb}, []int{og, oc, ob})
	for k := range og {
		for c := range oc {
			require.Equal(t, r.Columns().Cell(k, c), o.Columns().Cell(k, c))
		}
	}
	s, err := o.Snapshot()
	require.NoError(t, err)
	for _, key := range []string{"a", "b"} {
		v, _, err := s.View(colKind, key)
		require.NoError(t, err)
		require.NoError(t, checkColumns(o.Columns(), v, allCells))
	}
	s.Close()
	require.Equal(t, uint64(5), o.Stats().ColumnsUsed)

	// The reader's hot path allocates nothing.
	p := o.Columns()
	var sum float32
	allocs := testing.AllocsPerRun(100, func() {
		for k := range og {
			for c := range oc {
				sum += p.CellFloat32(k, c)[0]
				_ = p.Cell(k, c)
			}
		}
		_, _, _ = p.Geometry()
	})
	require.Zero(t, allocs)
	_ = sum
	require.NoError(t, o.Close())
	c, n, b := o.Columns().Geometry()
	require.Zero(t, c+n+b, "a closed region has no pool to read")
}

// A header whose pool geometry disagrees with the file is ErrCorrupt, whatever field lies.
func TestColumnHeaderRefused(t *testing.T) {
	l := computeLayout(64, 64, 64<<10, 4, 64).withPool(4, 3, 128)
	for _, c := range []struct {
		field, val uint64
	}{
		{hPoolOff, 0}, {hPoolOff, l.poolOff + 4096}, {hPoolOff, l.poolOff - poolAlign},
		{hColumns, 0}, {hColumns, 5}, {hColumns, maxColumns + 1},
		{hColumnCells, 0}, {hColumnCells, 4}, {hColumnCells, 1 << 62},
		{hCellBytes, 0}, {hCellBytes, 100}, {hCellBytes, 192}, {hCellBytes, 1 << 63},
	} {
		h := make([]byte, headerSize)
		writeHeader(h, l, 1, 1, nil)
		_, err := parseHeader(h, l.totalSize)
		require.NoError(t, err)
		binary.LittleEndian.PutUint64(h[c.field:], c.val)
		binary.LittleEndian.PutUint64(h[hChecksum:], uint64(headerChecksum(h)))
		_, err = parseHeader(h, l.totalSize)
		require.ErrorIs(t, err, ErrCorrupt, "field %d = %d", c.field, c.val)
	}
	// A pool-less header with the file a pool would need, and one claiming a pool in a file
	// of a pool-less size.
	h := make([]byte, headerSize)
	writeHeader(h, l, 1, 1, nil)
	noPool := computeLayout(64, 64, 64<<10, 4, 64)
	_, err := parseHeader(h, noPool.totalSize)
	require.ErrorIs(t, err, ErrCorrupt)
	writeHeader(h, noPool, 1, 1, nil)
	_, err = parseHeader(h, l.totalSize)
	require.ErrorIs(t, err, ErrCorrupt)
}

func memfdBytes(t *testing.T, f *os.File) int64 {
	t.Helper()
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(int(f.Fd()), &st))
	return st.Blocks * 512
}

// A 640 MiB pool costs no memory until cells are written: Create and Open touch none of it, a
// written cell costs about its own size, and reusing a column zeroes only the cells earlier
// values wrote (zeroing all of a 10 MiB column would fault it in).
func TestColumnPoolNotResident(t *testing.T) {
	const cellBytes = 64 << 10
	r := newTestRegion(t, Config{IndexSlots: 256, ArenaBytes: 1 << 20, ReaderSlots: 4, Columns: 64, ColumnCells: 160, CellBytes: cellBytes})
	data, _ := r.Files()
	require.Equal(t, int64(640<<20), int64(r.l.poolBytes()))
	base := memfdBytes(t, data)
	require.Less(t, base, int64(4<<20), "a fresh region is small")
	o, err := Open(r.Files())
	require.NoError(t, err)
	defer o.Close()
	s, err := o.Snapshot()
	require.NoError(t, err)
	s.Close()
	require.Equal(t, base, memfdBytes(t, data), "Open and a snapshot touch no pool page")

	for round := range 4 {
		// Column 0 each time, cell 77 in even rounds, 78 in odd ones: the other cell, written
		// by the round before, reads zero.
		one := func(_ uint64, cell int) bool { return cell == 77+round%2 }
		_, err := r.Update(func(tx *Tx) error {
			_, err := writeColumns(tx, "k", 1, uint64(round), one)
			return err
		})
		require.NoError(t, err)
		v, err := o.Get(colKind, "k", nil)
		require.NoError(t, err)
		_, cols, _ := parseColValue(v)
		require.Equal(t, []int{0}, cols)
		require.Equal(t, cellPattern(uint64(round), 77+round%2, cellBytes), o.Columns().Cell(0, 77+round%2))
		require.Equal(t, make([]byte, cellBytes), o.Columns().Cell(0, 78-round%2), "round %d: the cell the round before wrote, zeroed", round)
		_, err = r.Delete(colKind, "k")
		require.NoError(t, err)
		require.NoError(t, r.Reclaim())
		require.Zero(t, r.Stats().ColumnsUsed)
	}
	grown := memfdBytes(t, data) - base
	require.Less(t, grown, int64(4<<20), "written two 64 KiB cells; grew %d bytes", grown)
}

// sealedFile is a sealed memfd of size bytes starting with content, as Open requires.
func sealedFile(t *testing.T, size uint64, content []byte) *os.File {
	t.Helper()
	f, err := memfd("shmsteer-test", size)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	_, err = f.WriteAt(content, 0)
	require.NoError(t, err)
	_, err = unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW)
	require.NoError(t, err)
	return f
}

// Open refuses data files whose pool geometry disagrees with their size, with the typed error
// and no fault: a pool the file is too small for, a pool-less header in a pool-sized file.
func TestOpenRefusesBadPool(t *testing.T) {
	base := computeLayout(64, 64, 64<<10, 4, 64)
	pool := base.withPool(4, 3, 128)
	readers := make([]byte, lineSize)
	binary.LittleEndian.PutUint64(readers[rMagic:], readersMagic)
	binary.LittleEndian.PutUint64(readers[rSlots:], 4)
	for _, c := range []struct {
		name   string
		l      layout
		size   uint64
		layout uint64
		want   error
	}{
		{"pool larger than the file", pool, pool.totalSize - 4096, LayoutVersion, ErrCorrupt},
		{"pool header in a pool-less file", pool, base.totalSize, LayoutVersion, ErrCorrupt},
		{"pool-less header in a pool-sized file", base, pool.totalSize, LayoutVersion, ErrCorrupt},
		{"five columns in a file for four", base.withPool(5, 3, 128), pool.totalSize, LayoutVersion, ErrCorrupt},
		{"layout 3", pool, pool.totalSize, 3, ErrIncompatible},
		{"sound", pool, pool.totalSize, LayoutVersion, nil},
	} {
		h := make([]byte, headerSize)
		writeHeader(h, c.l, 1, 1, nil)
		if c.layout != LayoutVersion {
			binary.LittleEndian.PutUint64(h[hLayout:], c.layout|headerSize<<32)
			binary.LittleEndian.PutUint64(h[hChecksum:], uint64(headerChecksum(h)))
		}
		r, err := Open(sealedFile(t, c.size, h), sealedFile(t, readersSize(4), readers))
		if c.want == nil {
			require.NoError(t, err, c.name)
			cols, cells, cb := r.Columns().Geometry()
			require.Equal(t, []int{4, 3, 128}, []int{cols, cells, cb})
			require.Equal(t, make([]byte, 128), r.Columns().Cell(3, 2))
			require.NoError(t, r.Close())
			continue
		}
		require.ErrorIs(t, err, c.want, c.name)
	}
}

// TestColumnGroupFaultedTogether: the first cell handed out at an index of a group of colGroup
// adjacent columns faults that cell of the whole group in (and nothing else), so the cells a
// step reads side by side lie together; later cells of the group at that index fault nothing;
// the group's other cells still read zero, and a value's bytes are what it wrote.
func TestColumnGroupFaultedTogether(t *testing.T) {
	const cellBytes = 64 << 10
	r := newTestRegion(t, Config{IndexSlots: 256, ArenaBytes: 1 << 20, ReaderSlots: 4, Columns: 2 * colGroup, ColumnCells: 4, CellBytes: cellBytes})
	data, _ := r.Files()
	write := func(key string, col, cell int, seed uint64) {
		t.Helper()
		_, err := r.Update(func(tx *Tx) error {
			for {
				k, err := tx.AllocColumn()
				if err != nil {
					return err
				}
				if k != col {
					continue // reserved and left unattached: freed at commit
				}
				b, err := tx.Cell(k, cell)
				if err != nil {
					return err
				}
				copy(b, cellPattern(seed, cell, cellBytes))
				if err := tx.Put(colKind, key, []byte{byte(k)}); err != nil {
					return err
				}
				return tx.Attach(colKind, key, k)
			}
		})
		require.NoError(t, err)
	}
	// Each write also puts a small value in the arena (a page or two of index and arena), far
	// less than one cell.
	const slack = cellBytes / 2
	var base int64
	grew := func(want int, what string) {
		t.Helper()
		now := memfdBytes(t, data)
		require.GreaterOrEqual(t, now-base, int64(want*cellBytes), what)
		require.Less(t, now-base, int64(want*cellBytes+slack), what)
		base = now
	}
	base = memfdBytes(t, data)
	write("a", 0, 2, 1)
	grew(colGroup, "cell 2 of columns 0-7 faulted in together")
	write("b", 1, 2, 2)
	grew(0, "cell 2 of column 1: already in")
	write("c", 1+colGroup, 2, 3)
	grew(colGroup, "the second group's cell 2")
	write("d", 2+colGroup, 3, 4)
	grew(colGroup, "the second group's cell 3")
	pool := r.Columns()
	require.Equal(t, cellPattern(1, 2, cellBytes), pool.Cell(0, 2))
	require.Equal(t, cellPattern(2, 2, cellBytes), pool.Cell(1, 2))
	require.Equal(t, cellPattern(3, 2, cellBytes), pool.Cell(1+colGroup, 2))
	require.Equal(t, cellPattern(4, 3, cellBytes), pool.Cell(2+colGroup, 3))
	for _, k := range []int{2, 3, colGroup - 1, colGroup} {
		require.Equal(t, make([]byte, cellBytes), pool.Cell(k, 2), "column %d cell 2: faulted in, never written", k)
	}
}

// TestCellsFloat32: a run of adjacent columns' cells is one view of exactly those cells, in
// column order, and any run reaching outside the pool is nil.
func TestCellsFloat32(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 256, ArenaBytes: 1 << 20, ReaderSlots: 4, Columns: 5, ColumnCells: 3, CellBytes: 128})
	_, err := r.Update(func(tx *Tx) error {
		for k := range 5 {
			col, err := tx.AllocColumn()
			if err != nil {
				return err
			}
			for c := range 3 {
				b, err := tx.Cell(col, c)
				if err != nil {
					return err
				}
				f := AsFloat32(b)
				for i := range f {
					f[i] = float32(100*k + 10*c + i)
				}
			}
			if err := tx.Put(colKind, fmt.Sprint("v", k), []byte{byte(col)}); err != nil {
				return err
			}
			if err := tx.Attach(colKind, fmt.Sprint("v", k), col); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, err)
	pool := r.Columns()
	run := pool.CellsFloat32(1, 3, 2)
	require.Len(t, run, 3*32)
	for j := range 3 {
		require.Equal(t, pool.CellFloat32(1+j, 2), run[j*32:(j+1)*32], "column %d's cell in the run", 1+j)
	}
	require.Len(t, pool.CellsFloat32(0, 5, 0), 5*32)
	for _, c := range [][3]int{{4, 2, 0}, {0, 6, 0}, {0, 0, 1}, {-1, 2, 0}, {0, 1, 3}, {0, 1, -1}, {5, 1, 0}} {
		require.Nil(t, pool.CellsFloat32(c[0], c[1], c[2]), "run %v", c)
	}
	require.Nil(t, ColumnPool{}.CellsFloat32(0, 1, 0))
}
