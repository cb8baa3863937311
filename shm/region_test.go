//go:build linux

package shm

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func newTestRegion(t testing.TB, cfg Config) *Region {
	t.Helper()
	r, err := Create(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	return r
}

func TestPutGetDelete(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 256, ArenaBytes: 1 << 20})
	v1, err := r.Put(1, "alpha", []byte("one"))
	require.NoError(t, err)
	got, err := r.Get(1, "alpha", nil)
	require.NoError(t, err)
	require.Equal(t, "one", string(got))

	_, err = r.Get(2, "alpha", nil)
	require.ErrorIs(t, err, ErrNotFound, "kinds are separate namespaces")

	v2, err := r.Put(1, "alpha", []byte("two"))
	require.NoError(t, err)
	require.Greater(t, v2, v1)
	got, err = r.Get(1, "alpha", got[:0])
	require.NoError(t, err)
	require.Equal(t, "two", string(got))

	_, err = r.Delete(1, "alpha")
	require.NoError(t, err)
	_, err = r.Get(1, "alpha", nil)
	require.ErrorIs(t, err, ErrNotFound)
	_, err = r.Delete(1, "alpha")
	require.ErrorIs(t, err, ErrNotFound)
	require.Equal(t, uint64(0), r.Stats().Entries)
}

func TestBadInput(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 64, ArenaBytes: 64 << 10})
	_, err := r.Put(1, "k", []byte("v"))
	require.NoError(t, err)
	before := r.Stats()
	long := string(make([]byte, MaxKeyLen+1))
	for _, tc := range []struct {
		name string
		put  func() error
		want error
	}{
		{"kind0", func() error { _, err := r.Put(0, "k", nil); return err }, ErrBadKind},
		{"emptyKey", func() error { _, err := r.Put(1, "", nil); return err }, ErrKeyTooLong},
		{"longKey", func() error { _, err := r.Put(1, long, nil); return err }, ErrKeyTooLong},
		{"tooBigForArena", func() error { _, err := r.Put(1, "big", make([]byte, 128<<10)); return err }, ErrValueTooLarge},
		{"full", func() error { _, err := r.Put(1, "big", make([]byte, 63<<10)); return err }, ErrRegionFull},
		{"failInTx", func() error {
			_, err := r.Update(func(tx *Tx) error {
				require.NoError(t, tx.Put(1, "k", []byte("changed")))
				return errors.New("boom")
			})
			return err
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.put()
			require.Error(t, err)
			if tc.want != nil {
				require.ErrorIs(t, err, tc.want)
			}
			got, err := r.Get(1, "k", nil)
			require.NoError(t, err)
			require.Equal(t, "v", string(got))
			after := r.Stats()
			require.Equal(t, before.Version, after.Version)
			require.Equal(t, before.Entries, after.Entries)
			require.Equal(t, before.AllocBytes, after.AllocBytes)
		})
	}
}

func TestSnapshotSeesPinnedVersion(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 256, ArenaBytes: 1 << 20})
	_, err := r.Update(func(tx *Tx) error {
		for i := 0; i < 10; i++ {
			if err := tx.Put(1, fmt.Sprint("k", i), []byte(fmt.Sprint("v0-", i))); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, err)
	snap, err := r.Snapshot()
	require.NoError(t, err)
	for round := 1; round < 100; round++ {
		_, err := r.Update(func(tx *Tx) error {
			for i := 0; i < 10; i++ {
				if i%3 == 0 {
					tx.Delete(1, fmt.Sprint("k", i))
				} else if err := tx.Put(1, fmt.Sprint("k", i), []byte(fmt.Sprint("v", round, "-", i))); err != nil {
					return err
				}
			}
			return nil
		})
		require.NoError(t, err)
		require.NoError(t, r.Reclaim())
	}
	for i := 0; i < 10; i++ {
		got, err := snap.Get(1, fmt.Sprint("k", i), nil)
		require.NoError(t, err)
		require.Equal(t, fmt.Sprint("v0-", i), string(got))
	}
	n, err := snap.Len(1)
	require.NoError(t, err)
	require.Equal(t, 10, n)
	require.NoError(t, snap.Check())
	snap.Close()
	require.NoError(t, r.Reclaim())
	require.NoError(t, r.Reclaim())
	st := r.Stats()
	require.Zero(t, st.RetiredBytes)
	require.Equal(t, uint64(6), st.Entries)
}
