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
