package shm

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestUpdateAllocatesNothing: a write of one value allocates nothing in the owner's process
// (the Tx and its ops array are the writer's, reused), so a stream of writes gives the
// garbage collector no work, whose cycles were most of the owner's Set tail (keys.set.owner
// p99). A Tx of many ops leaves no large array behind, and the reused array holds no key.
func TestUpdateAllocatesNothing(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 1024, ArenaBytes: 1 << 20})
	keys := make([]string, 64)
	for i := range keys {
		keys[i] = fmt.Sprintf("request-%04d-0000-0000-000000000000", i)
	}
	val := make([]byte, 32)
	for _, k := range keys {
		_, err := r.Put(testKind, k, val)
		require.NoError(t, err)
	}
	i := 0
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := r.Put(testKind, keys[i%len(keys)], val); err != nil {
			t.Fatal(err)
		}
		i++
	})
	require.Zero(t, allocs, "Region.Put")

	_, err := r.Update(func(tx *Tx) error {
		for _, k := range keys {
			if err := tx.Put(testKind, k, val); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.Nil(t, r.w.tx.ops, "a Tx of %d ops keeps its array", len(keys))

	_, err = r.Put(testKind, keys[0], val)
	require.NoError(t, err)
	require.LessOrEqual(t, cap(r.w.tx.ops), keepOps)
	for _, op := range r.w.tx.ops[:cap(r.w.tx.ops)] {
		require.Zero(t, op, "the reused ops array still holds an op")
	}

	// A key put and deleted in one Tx is dropped from its ops, which leaves its op past their
	// length: that is cleared too.
	_, err = r.Update(func(tx *Tx) error {
		require.NoError(t, tx.Put(testKind, "new-a", val))
		require.NoError(t, tx.Put(testKind, "new-b", val))
		return tx.Delete(testKind, "new-b")
	})
	require.NoError(t, err)
	for _, op := range r.w.tx.ops[:cap(r.w.tx.ops)] {
		require.Zero(t, op, "the reused ops array still holds a dropped op")
	}

	// An aborted Tx leaves the array as cleared as a committed one.
	_, err = r.Update(func(tx *Tx) error {
		require.NoError(t, tx.Put(testKind, keys[1], val))
		return ErrNotFound
	})
	require.ErrorIs(t, err, ErrNotFound)
	got, err := r.Get(testKind, keys[1], nil)
	require.NoError(t, err)
	require.Equal(t, val, got)
	for _, op := range r.w.tx.ops[:cap(r.w.tx.ops)] {
		require.Zero(t, op, "the reused ops array still holds an op after an abort")
	}
}
