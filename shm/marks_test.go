//go:build linux

package shm

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMarksVersioned: a mark is visible exactly from the version that added it to the version
// that removed it, in snapshots pinned on either side, and lookups of a marked key without a
// value give ErrMarked.
func TestMarksVersioned(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 256, ArenaBytes: 1 << 20, MarkSlots: 64})
	v0 := r.Version()
	s0, err := r.Snapshot()
	require.NoError(t, err)
	defer s0.Close()

	v1, err := r.Update(func(tx *Tx) error { return tx.Mark(testKind, "a") })
	require.NoError(t, err)
	s1, err := r.Snapshot()
	require.NoError(t, err)
	defer s1.Close()
	_, err = r.Update(func(tx *Tx) error { return tx.Mark(testKind, "a") }) // again: a no-op
	require.NoError(t, err)
	require.EqualValues(t, 1, r.Stats().Marks)

	_, err = r.Update(func(tx *Tx) error { return tx.Unmark(testKind, "a") })
	require.NoError(t, err)

	for _, tt := range []struct {
		name string
		s    *Snapshot
		want bool
	}{{"before", &s0, false}, {"while", &s1, true}} {
		got, err := tt.s.Marked(testKind, "a")
		require.NoError(t, err)
		require.Equal(t, tt.want, got, tt.name)
		_, _, err = tt.s.View(testKind, "a")
		if tt.want {
			require.ErrorIs(t, err, ErrMarked, tt.name)
		} else {
			require.ErrorIs(t, err, ErrNotFound, tt.name)
		}
	}
	require.Greater(t, v1, v0)
	got, err := r.Marked(testKind, "a")
	require.NoError(t, err)
	require.False(t, got, "unmarked now")
	_, err = r.Get(testKind, "a", nil)
	require.ErrorIs(t, err, ErrNotFound)
	require.Zero(t, r.Stats().Marks)

	// Kinds are apart; a marked key with a value reads the value.
	_, err = r.Update(func(tx *Tx) error { return tx.Mark(testKind, "b") })
	require.NoError(t, err)
	_, err = r.Get(vectorKind, "b", nil)
	require.ErrorIs(t, err, ErrNotFound)
	_, err = r.Get(testKind, "b", nil)
	require.ErrorIs(t, err, ErrMarked)
	rd, err := r.NewReader()
	require.NoError(t, err)
	defer rd.Close()
	_, err = rd.Get(testKind, "b", nil)
	require.ErrorIs(t, err, ErrMarked)
}

// TestMarksAbort: a failed Tx leaves no mark and restores unmarked ones.
func TestMarksAbort(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 256, ArenaBytes: 1 << 20, MarkSlots: 64})
	_, err := r.Update(func(tx *Tx) error { return tx.Mark(testKind, "keep") })
	require.NoError(t, err)
	boom := fmt.Errorf("boom")
	_, err = r.Update(func(tx *Tx) error {
		require.NoError(t, tx.Mark(testKind, "new"))
		require.NoError(t, tx.Unmark(testKind, "keep"))
		return boom
	})
	require.ErrorIs(t, err, boom)
	for k, want := range map[string]bool{"keep": true, "new": false} {
		got, err := r.Marked(testKind, k)
		require.NoError(t, err)
		require.Equal(t, want, got, k)
	}
	require.EqualValues(t, 1, r.Stats().Marks)
}

// TestMarksReclaimAndReuse churns far more marks than the table has entries: removed entries
// become tombstones once no pin can see them, are reused, and turn empty again, so the table
// never fills; a snapshot held across the churn keeps seeing its marks.
func TestMarksReclaimAndReuse(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 256, ArenaBytes: 1 << 20, MarkSlots: 64})
	_, err := r.Update(func(tx *Tx) error { return tx.Mark(testKind, "held") })
	require.NoError(t, err)
	held, err := r.Snapshot()
	require.NoError(t, err)
	_, err = r.Update(func(tx *Tx) error { return tx.Unmark(testKind, "held") })
	require.NoError(t, err)
	for i := 0; i < 40; i++ { // with "held" pinned, its entry stays
		k := fmt.Sprintf("m-%d", i)
		_, err := r.Update(func(tx *Tx) error { return tx.Mark(testKind, k) })
		require.NoError(t, err)
		_, err = r.Update(func(tx *Tx) error { return tx.Unmark(testKind, k) })
		require.NoError(t, err)
	}
	got, err := held.Marked(testKind, "held")
	require.NoError(t, err)
	require.True(t, got, "a pinned snapshot still sees its mark")
	held.Close()
	for i := 0; i < 2000; i++ {
		k := fmt.Sprintf("n-%d", i)
		_, err := r.Update(func(tx *Tx) error { return tx.Mark(testKind, k) })
		require.NoError(t, err, "mark %d: reclaimed entries are reused", i)
		_, err = r.Update(func(tx *Tx) error { return tx.Unmark(testKind, k) })
		require.NoError(t, err)
	}
	require.NoError(t, r.Reclaim())
	require.NoError(t, r.Reclaim())
	st := r.Stats()
	require.Zero(t, st.Marks)
	require.Less(t, st.MarkEntries, uint64(64))
}

// TestMarksFull: a full mark table is ErrRegionFull naming the table and the setting to raise.
func TestMarksFull(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 256, ArenaBytes: 1 << 20, MarkSlots: 64})
	var err error
	for i := 0; i < 65 && err == nil; i++ {
		k := fmt.Sprintf("f-%d", i)
		_, err = r.Update(func(tx *Tx) error { return tx.Mark(testKind, k) })
	}
	require.ErrorIs(t, err, ErrRegionFull)
	require.Contains(t, err.Error(), "MarkSlots")
	require.EqualValues(t, 64, r.Stats().Marks)
}

// TestRegionFullSaysWhich: an index or arena that is full says which, how full, and what to
// raise.
func TestRegionFullSaysWhich(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 64, ArenaBytes: 1 << 20, MaxProbe: 4})
	var err error
	for i := 0; i < 200 && err == nil; i++ {
		_, err = r.Put(testKind, fmt.Sprintf("i-%d", i), []byte{1})
	}
	require.ErrorIs(t, err, ErrRegionFull)
	require.Contains(t, err.Error(), "index")
	require.Contains(t, err.Error(), "IndexSlots")

	r = newTestRegion(t, Config{IndexSlots: 1024, ArenaBytes: 64 << 10})
	err = nil
	for i := 0; i < 200 && err == nil; i++ {
		_, err = r.Put(testKind, fmt.Sprintf("a-%d", i), make([]byte, 4000))
	}
	require.ErrorIs(t, err, ErrRegionFull)
	require.Contains(t, err.Error(), "arena")
	require.Contains(t, err.Error(), "ArenaBytes")
}

// TestErrMarkedIsNotFound: a marked key has no value, so ErrMarked matches ErrNotFound too.
func TestErrMarkedIsNotFound(t *testing.T) {
	require.ErrorIs(t, ErrMarked, ErrNotFound)
	require.NotErrorIs(t, ErrNotFound, ErrMarked)
}
