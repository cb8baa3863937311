//go:build linux

package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

const colKind Kind = 9

// cellPattern is what a value of seed writes into cell cell: a pure function of both, never
// all zero, so a reader can tell it from a zeroed or reused cell.
func cellPattern(seed uint64, cell, n int) []byte {
	rng := rand.New(rand.NewPCG(seed, uint64(cell)+1))
	b := make([]byte, n)
	for i := 0; i < n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], rng.Uint64()|1)
	}
	return b
}

// colValue is a value naming its columns and the seed their cells derive from.
func colValue(seed uint64, cols []int) []byte {
	b := binary.LittleEndian.AppendUint64(nil, seed)
	for _, k := range cols {
		b = binary.LittleEndian.AppendUint32(b, uint32(k))
	}
	return b
}

func parseColValue(v []byte) (seed uint64, cols []int, err error) {
	if len(v) < 8 || (len(v)-8)%4 != 0 {
		return 0, nil, fmt.Errorf("column value of %d bytes", len(v))
	}
	seed = binary.LittleEndian.Uint64(v)
	for i := 8; i < len(v); i += 4 {
		cols = append(cols, int(binary.LittleEndian.Uint32(v[i:])))
	}
	return seed, cols, nil
}

// writeColumns reserves n columns in tx, fills the cells for which write says so from seed,
// stores the value naming them under key and attaches them.
func writeColumns(tx *Tx, key string, n int, seed uint64, write func(seed uint64, cell int) bool) ([]int, error) {
	_, cells, cb := tx.r.Columns().Geometry()
	var cols []int
	for range n {
		k, err := tx.AllocColumn()
		if err != nil {
			return nil, err
		}
		for c := 0; c < cells; c++ {
			if !write(seed, c) {
				continue
			}
			dst, err := tx.Cell(k, c)
			if err != nil {
				return nil, err
			}
			copy(dst, cellPattern(seed^uint64(k)<<32, c, cb))
		}
		cols = append(cols, k)
	}
	if err := tx.Put(colKind, key, colValue(seed, cols)); err != nil {
		return nil, err
	}
	return cols, tx.Attach(colKind, key, cols...)
}

func allCells(uint64, int) bool { return true }

// someCells writes two cells in three, which ones depending on the seed: a reader checks the
// others read zero (a reused column was zeroed).
func someCells(seed uint64, cell int) bool { return (seed+uint64(cell))%3 != 0 }

// checkColumns verifies that the columns a value names hold what it wrote (and zero where
// write says it wrote nothing).
func checkColumns(p ColumnPool, v []byte, write func(seed uint64, cell int) bool) error {
	seed, cols, err := parseColValue(v)
	if err != nil {
		return err
	}
	_, cells, cb := p.Geometry()
	zero := make([]byte, cb)
	for _, k := range cols {
		for c := 0; c < cells; c++ {
			got := p.Cell(k, c)
			want := zero
			if write(seed, c) {
				want = cellPattern(seed^uint64(k)<<32, c, cb)
			}
			if string(got) != string(want) {
				return fmt.Errorf("column %d cell %d of the value of seed %d holds other bytes", k, c, seed)
			}
		}
	}
	return nil
}

func putColumns(t *testing.T, r *Region, key string, n int, seed uint64) []int {
	t.Helper()
	return putSomeColumns(t, r, key, n, seed, allCells)
}

func putSomeColumns(t *testing.T, r *Region, key string, n int, seed uint64, write func(uint64, int) bool) []int {
	t.Helper()
	var cols []int
	_, err := r.Update(func(tx *Tx) error {
		var err error
		cols, err = writeColumns(tx, key, n, seed, write)
		return err
	})
	require.NoError(t, err)
	return cols
}

// colRegion is a region with a small pool whose reclamation passes run only inline or in
// Reclaim (no background loop), so the counts a test checks change only where it says.
// requireColumnsOf checks that key's value at the current version names cols, which hold what
// it wrote: write's cells, zero elsewhere.
func requireColumnsOf(t *testing.T, r *Region, key string, cols []int, write func(uint64, int) bool) {
	t.Helper()
	v, err := r.Get(colKind, key, nil)
	require.NoError(t, err)
	_, got, err := parseColValue(v)
	require.NoError(t, err)
	require.Equal(t, cols, got)
	require.NoError(t, checkColumns(r.Columns(), v, write))
}

func colRegion(t *testing.T, columns, cells, cellBytes int) *Region {
	r := newTestRegion(t, Config{IndexSlots: 256, ArenaBytes: 1 << 20, ReaderSlots: 8, Columns: columns, ColumnCells: cells, CellBytes: cellBytes})
	r.w.mu.Lock()
	r.w.looping = true
	r.w.mu.Unlock()
	return r
}

// The whole cycle: a value's columns are readable at once, survive nothing of their value's
// replacement or deletion beyond the reclamation that frees the blob, come back zeroed, and are
// reused lowest first.
func TestColumnLifecycle(t *testing.T) {
	r := colRegion(t, 4, 3, 128)
	p := r.Columns()
	cols, cells, cb := p.Geometry()
	require.Equal(t, []int{4, 3, 128}, []int{cols, cells, cb})
	a := putColumns(t, r, "k1", 1, 11)
	require.Equal(t, []int{0}, a)
	v, err := r.Get(colKind, "k1", nil)
	require.NoError(t, err)
	require.NoError(t, checkColumns(p, v, allCells))
	st := r.Stats()
	require.Equal(t, []uint64{4, 1, 0}, []uint64{st.Columns, st.ColumnsUsed, st.ColumnsRetired})

	// Cell-major: cell c of columns k and k+1 are adjacent.
	require.Equal(t, addrOf(p.Cell(0, 1), 0)+128, addrOf(p.Cell(1, 1), 0))
	require.Equal(t, addrOf(p.Cell(3, 0), 0)+128, addrOf(p.Cell(0, 1), 0))

	// Replaced: the old column is retired, held while a snapshot pins it, freed and zeroed
	// after.
	s, err := r.Snapshot()
	require.NoError(t, err)
	b := putColumns(t, r, "k1", 2, 12)
	require.Equal(t, []int{1, 2}, b, "the live column is not reused")
	st = r.Stats()
	require.Equal(t, []uint64{3, 1}, []uint64{st.ColumnsUsed, st.ColumnsRetired})
	require.NoError(t, r.Reclaim())
	old, _, err := s.View(colKind, "k1")
	require.NoError(t, err)
	require.NoError(t, checkColumns(p, old, allCells), "the pinned version's column")
	require.Equal(t, uint64(1), r.Stats().ColumnsRetired)
	s.Close()
	require.NoError(t, r.Reclaim())
	st = r.Stats()
	require.Equal(t, []uint64{2, 0}, []uint64{st.ColumnsUsed, st.ColumnsRetired})
	v, err = r.Get(colKind, "k1", nil)
	require.NoError(t, err)
	require.NoError(t, checkColumns(p, v, allCells))

	// Deleted: both columns retired at the deletion, freed by the pass.
	_, err = r.Delete(colKind, "k1")
	require.NoError(t, err)
	require.Equal(t, uint64(2), r.Stats().ColumnsRetired)
	require.NoError(t, r.Reclaim())
	st = r.Stats()
	require.Equal(t, []uint64{0, 0}, []uint64{st.ColumnsUsed, st.ColumnsRetired})
	// Reused, every column holds only what the new value wrote: zero in the cells it left,
	// which earlier values had written.
	cols4 := putSomeColumns(t, r, "k2", 4, 13, someCells)
	require.Equal(t, []int{0, 1, 2, 3}, cols4, "every column reused")
	requireColumnsOf(t, r, "k2", cols4, someCells)
}

// A column whose value is replaced in the same transaction that wrote it is detached (still
// reserved); attached again it goes live with the new value, else it is freed at commit.
func TestColumnSameTxRewrite(t *testing.T) {
	r := colRegion(t, 4, 2, 64)
	_, err := r.Update(func(tx *Tx) error {
		cols, err := writeColumns(tx, "k", 2, 5, allCells)
		require.NoError(t, err)
		require.NoError(t, tx.Put(colKind, "k", colValue(5, cols[:1])))
		return tx.Attach(colKind, "k", cols[0])
	})
	require.NoError(t, err)
	st := r.Stats()
	require.Equal(t, []uint64{1, 0}, []uint64{st.ColumnsUsed, st.ColumnsRetired}, "column 1 was detached and freed at commit")
	v, err := r.Get(colKind, "k", nil)
	require.NoError(t, err)
	require.NoError(t, checkColumns(r.Columns(), v, allCells))

	// Created and deleted in one transaction: its columns are freed at commit.
	_, err = r.Update(func(tx *Tx) error {
		_, err := writeColumns(tx, "gone", 2, 6, allCells)
		require.NoError(t, err)
		return tx.Delete(colKind, "gone")
	})
	require.NoError(t, err)
	require.Equal(t, uint64(1), r.Stats().ColumnsUsed)
	cols := putSomeColumns(t, r, "z", 2, 7, someCells)
	require.Equal(t, []int{1, 2}, cols)
	requireColumnsOf(t, r, "z", cols, someCells)
}

// An aborted transaction frees what it reserved (zeroed), and a column reserved but never
// attached is freed at commit: no published value names it.
func TestColumnAbortAndUnattachedFree(t *testing.T) {
	r := colRegion(t, 3, 2, 64)
	boom := errors.New("boom")
	_, err := r.Update(func(tx *Tx) error {
		_, err := writeColumns(tx, "k", 2, 7, allCells)
		require.NoError(t, err)
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.Zero(t, r.Stats().ColumnsUsed)
	_, err = r.Get(colKind, "k", nil)
	require.ErrorIs(t, err, ErrNotFound)

	_, err = r.Update(func(tx *Tx) error {
		a, err := tx.AllocColumn()
		require.NoError(t, err)
		dst, err := tx.Cell(a, 1)
		require.NoError(t, err)
		dst[0] = 1
		_, err = writeColumns(tx, "k", 1, 8, allCells)
		return err
	})
	require.NoError(t, err)
	require.Equal(t, uint64(1), r.Stats().ColumnsUsed, "the unattached column 0 was freed at commit")
	requireColumnsOf(t, r, "k", []int{1}, allCells)
	requireColumnsOf(t, r, "k2", putSomeColumns(t, r, "k2", 1, 9, func(uint64, int) bool { return false }), func(uint64, int) bool { return false })
}

// A freed column keeps its bytes until reused; reused, Tx.Cell hands out a stale cell zeroed
// (once: a second Cell of the same cell keeps what this Tx wrote), and the commit zeroes the
// stale cells the new value did not ask for, so readers see exactly what it wrote. An aborted
// reuse leaves the column dirty for the next.
func TestColumnReuseZeroes(t *testing.T) {
	r := colRegion(t, 1, 3, 64)
	p := r.Columns()
	putColumns(t, r, "a", 1, 1)
	_, err := r.Delete(colKind, "a")
	require.NoError(t, err)
	require.NoError(t, r.Reclaim())
	require.Equal(t, cellPattern(1, 0, 64), p.Cell(0, 0), "a free column keeps its bytes (no pass writes it)")
	boom := errors.New("abort")
	_, err = r.Update(func(tx *Tx) error {
		k, err := tx.AllocColumn()
		require.NoError(t, err)
		dst, err := tx.Cell(k, 2)
		require.NoError(t, err)
		require.Equal(t, make([]byte, 64), dst, "a stale cell handed out zeroed")
		copy(dst, "aborted")
		return boom
	})
	require.ErrorIs(t, err, boom)
	_, err = r.Update(func(tx *Tx) error {
		k, err := tx.AllocColumn()
		require.NoError(t, err)
		dst, err := tx.Cell(k, 1)
		require.NoError(t, err)
		require.Equal(t, make([]byte, 64), dst)
		copy(dst, "one")
		again, err := tx.Cell(k, 1)
		require.NoError(t, err)
		require.Equal(t, "one", string(again[:3]), "handed out once per Tx: not zeroed again")
		require.NoError(t, tx.Put(colKind, "b", colValue(2, []int{k})))
		return tx.Attach(colKind, "b", k)
	})
	require.NoError(t, err)
	require.Equal(t, make([]byte, 64), p.Cell(0, 0), "stale, not written by b: zeroed at commit")
	require.Equal(t, make([]byte, 64), p.Cell(0, 2), "written by the aborted Tx only: zeroed at commit")
	require.Equal(t, append([]byte("one"), make([]byte, 61)...), p.Cell(0, 1))
}

// A full pool answers ErrColumnsFull, naming what to do; a retired column held by a pin is
// named as such; once the holder's value is deleted and nothing pins it, AllocColumn's own
// reclamation pass frees it.
func TestColumnsFull(t *testing.T) {
	r := colRegion(t, 2, 2, 64)
	putColumns(t, r, "a", 1, 1)
	putColumns(t, r, "b", 1, 2)
	passes := r.w.pass
	_, err := r.Update(func(tx *Tx) error { _, err := tx.AllocColumn(); return err })
	require.Equal(t, passes, r.w.pass, "no column retired: no pass, which could free none")
	require.ErrorIs(t, err, ErrColumnsFull)
	require.ErrorContains(t, err, "all 2 columns taken (2 by published values, 0 retired, 0 reserved by this transaction)")
	require.ErrorContains(t, err, "raise Config.Columns")

	s, err := r.Snapshot()
	require.NoError(t, err)
	_, err = r.Delete(colKind, "a")
	require.NoError(t, err)
	passes = r.w.pass
	_, err = r.Update(func(tx *Tx) error { _, err := tx.AllocColumn(); return err })
	require.Equal(t, passes+1, r.w.pass, "a retired column: one inline pass")
	require.ErrorIs(t, err, ErrColumnsFull)
	require.ErrorContains(t, err, fmt.Sprintf("the retired columns wait for reader slot %d (pid %d as the holder sees itself) pinned at version %d", s.slot/lineSize-1, os.Getpid(), s.Version()))
	s.Close()
	require.Equal(t, []int{0}, putColumns(t, r, "c", 1, 3), "AllocColumn's own pass freed the deleted value's column")

	// No pool at all.
	plain := newTestRegion(t, Config{IndexSlots: 64, ArenaBytes: 64 << 10, ReaderSlots: 2})
	_, err = plain.Update(func(tx *Tx) error { _, err := tx.AllocColumn(); return err })
	require.ErrorIs(t, err, ErrColumnsFull)
	require.ErrorContains(t, err, "no column pool")
	require.Nil(t, plain.Columns().Cell(0, 0))
	c, n, b := plain.Columns().Geometry()
	require.Zero(t, c+n+b)
}

// A snapshot taken before a value's deletion reads its column unchanged through many cycles of
// other transactions taking, writing and giving back every other column (aborted, or left
// unattached: freed at once), even when they ask for more columns than are free; once the
// snapshot closes, the column is reused.
func TestColumnPinnedSnapshotKeepsRetired(t *testing.T) {
	r := colRegion(t, 4, 4, 256)
	p := r.Columns()
	held := putColumns(t, r, "held", 1, 99)
	s, err := r.Snapshot()
	require.NoError(t, err)
	_, err = r.Delete(colKind, "held")
	require.NoError(t, err)
	v, _, err := s.View(colKind, "held")
	require.NoError(t, err)
	boom := errors.New("abort")
	for i := range 200 {
		_, err := r.Update(func(tx *Tx) error {
			var got []int
			for range 3 {
				k, err := tx.AllocColumn()
				require.NoError(t, err)
				got = append(got, k)
				for c := range 4 {
					dst, err := tx.Cell(k, c)
					require.NoError(t, err)
					copy(dst, cellPattern(uint64(i), c, 256))
				}
			}
			require.NotContains(t, got, held[0], "cycle %d reused the pinned column", i)
			_, err := tx.AllocColumn()
			require.ErrorIs(t, err, ErrColumnsFull, "cycle %d", i)
			if i%2 == 0 {
				return boom
			}
			return nil // unattached: freed at commit
		})
		if i%2 == 0 {
			require.ErrorIs(t, err, boom)
		} else {
			require.NoError(t, err)
		}
		if i%5 == 0 {
			require.NoError(t, r.Reclaim())
		}
		require.NoError(t, checkColumns(p, v, allCells), "cycle %d", i)
	}
	s.Close()
	cols := putSomeColumns(t, r, "all", 4, 5, someCells)
	require.Equal(t, []int{1, 2, 3, 0}, cols, "the column came free once the snapshot closed (the fourth AllocColumn's pass freed it)")
	requireColumnsOf(t, r, "all", cols, someCells)
}

// Only the owner's columns of the Tx in progress are writable, cells in range; Attach needs a
// value written in the same Tx and columns reserved by it, once each. A refused Attach changes
// nothing: its columns stay reserved and unattached, freed at commit.
func TestBadColumn(t *testing.T) {
	r := colRegion(t, 4, 2, 64)
	live := putColumns(t, r, "live", 1, 1)
	var stale *Tx
	_, err := r.Update(func(tx *Tx) error {
		stale = tx
		for _, c := range []struct{ col, cell int }{{live[0], 0}, {3, 0}, {-1, 0}, {4, 0}, {1 << 40, 0}} {
			_, err := tx.Cell(c.col, c.cell)
			require.ErrorIs(t, err, ErrBadColumn, "cell %v", c)
		}
		k, err := tx.AllocColumn()
		require.NoError(t, err)
		for _, cell := range []int{-1, 2, 1 << 40} {
			_, err := tx.Cell(k, cell)
			require.ErrorIs(t, err, ErrBadColumn, "cell %d", cell)
		}
		dst, err := tx.Cell(k, 1)
		require.NoError(t, err)
		require.Equal(t, 64, len(dst))
		require.Equal(t, 64, cap(dst))

		require.ErrorIs(t, tx.Attach(colKind, "nothing", k), ErrBadColumn)
		require.ErrorContains(t, tx.Attach(colKind, "live", k), "Put it before Attach", "written in an earlier Tx only")
		require.NoError(t, tx.Put(colKind, "v", []byte("12345678")))
		require.ErrorIs(t, tx.Attach(colKind, "v", k, k), ErrBadColumn)
		require.ErrorIs(t, tx.Attach(colKind, "v", k, live[0]), ErrBadColumn)
		require.ErrorIs(t, tx.Attach(colKind, "v", k, 9), ErrBadColumn)
		require.NoError(t, tx.Delete(colKind, "live"))
		require.ErrorIs(t, tx.Attach(colKind, "live", k), ErrBadColumn, "a deletion has no columns")
		return nil
	})
	require.NoError(t, err)
	st := r.Stats()
	require.Equal(t, []uint64{1, 1}, []uint64{st.ColumnsUsed, st.ColumnsRetired}, "the refused attachments left the column unattached: freed at commit")
	_, err = stale.Cell(1, 0)
	require.ErrorIs(t, err, ErrBadColumn, "a committed Tx reserves nothing")

	_, err = r.Update(func(tx *Tx) error {
		k, err := tx.AllocColumn()
		require.NoError(t, err)
		require.NoError(t, tx.Put(colKind, "a", []byte("12345678")))
		require.NoError(t, tx.Put(colKind, "b", []byte("12345678")))
		require.NoError(t, tx.Attach(colKind, "a", k))
		require.ErrorContains(t, tx.Attach(colKind, "b", k), "already attached")
		return nil
	})
	require.NoError(t, err)

	plain := newTestRegion(t, Config{IndexSlots: 64, ArenaBytes: 64 << 10, ReaderSlots: 2})
	_, err = plain.Update(func(tx *Tx) error {
		_, err := tx.Cell(0, 0)
		require.ErrorIs(t, err, ErrBadColumn)
		require.NoError(t, tx.Put(colKind, "v", nil))
		require.ErrorIs(t, tx.Attach(colKind, "v", 0), ErrBadColumn)
		return nil
	})
	require.NoError(t, err)
}

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
