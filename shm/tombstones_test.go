package shm

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// missProbe is the number of index words a lookup of the absent key reads before it stops.
func missProbe(r *Region, kind Kind, key string) uint64 {
	h := keyHash(r.l.hashK0, r.l.hashK1, uint64(kind), []byte(key))
	for i := uint64(0); i < r.l.maxProbe; i++ {
		if load64(r.index, ((h+i)&r.l.mask())*8) == 0 {
			return i + 1
		}
	}
	return r.l.maxProbe
}

// TestTombstonesEmptied: a region that admits and ends requests for a long time (here 50,000
// keys put and deleted, 200 live throughout) keeps its index mostly empty, so a miss stays
// short. Before tombstones were emptied, every one of the 4096 index words was a tombstone
// after this and each miss read all 512 words of MaxProbe.
func TestTombstonesEmptied(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 1 << 12, ArenaBytes: 8 << 20})
	val := make([]byte, 64)
	for i := range 200 {
		_, err := r.Put(1, fmt.Sprint("live-", i), val)
		require.NoError(t, err)
	}
	for n := range 50_000 {
		k := fmt.Sprint("req-", n)
		_, err := r.Put(1, k, val)
		require.NoError(t, err)
		_, err = r.Delete(1, k)
		require.NoError(t, err)
		if n%256 == 0 {
			require.NoError(t, r.Reclaim())
		}
	}
	require.NoError(t, r.Reclaim())
	_, err := r.Put(1, "last", val) // a commit unlinks the markers the passes released
	require.NoError(t, err)
	used, tombs := r.indexUse()
	require.Less(t, tombs, uint64(256), "tombstones left (of %d words used)", used)
	probes := make([]uint64, 1000)
	for i := range probes {
		probes[i] = missProbe(r, 1, fmt.Sprint("miss-", i))
	}
	slices.Sort(probes)
	require.LessOrEqual(t, probes[len(probes)/2], uint64(2), "median words a miss reads")
	require.Less(t, probes[len(probes)-1], uint64(64), "most words a miss reads")
	for i := range 200 {
		got, err := r.Get(1, fmt.Sprint("live-", i), nil)
		require.NoError(t, err)
		require.Equal(t, val, got)
	}
}

// TestTombstoneEmptyingKeepsKeys churns a small, crowded index (long probe runs, most words
// used) with random puts and deletes in transactions, checking after each against a model
// that every key reads as it should, while a reader goroutine looks up keys that are never
// deleted and must find each one every time, whatever words are emptied around them.
func TestTombstoneEmptyingKeepsKeys(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 256, ArenaBytes: 4 << 20, MaxProbe: 256})
	const stable, universe = 40, 400
	stableKey := func(i int) string { return fmt.Sprint("stable-", i) }
	for i := range stable {
		_, err := r.Put(2, stableKey(i), []byte(stableKey(i)))
		require.NoError(t, err)
	}
	rd, err := r.NewReader()
	require.NoError(t, err)
	t.Cleanup(func() { rd.Close() })
	var stop atomic.Bool
	var wg sync.WaitGroup
	var lost atomic.Value
	wg.Go(func() {
		for i := 0; !stop.Load(); i++ {
			k := stableKey(i % stable)
			got, err := rd.Get(2, k, nil)
			if err != nil || string(got) != k {
				lost.Store(fmt.Sprintf("%s: %q, %v", k, got, err))
				return
			}
		}
	})
	model := map[string][]byte{}
	rng := rand.New(rand.NewPCG(7, 43))
	maxTombs := uint64(0)
	for step := range 6000 {
		_, err := r.Update(func(tx *Tx) error {
			for range 1 + rng.IntN(3) {
				k := fmt.Sprint("k-", rng.IntN(universe))
				if _, ok := model[k]; ok && rng.IntN(2) == 0 {
					if err := tx.Delete(1, k); err != nil {
						return err
					}
					delete(model, k)
					continue
				}
				if len(model) >= 180 {
					continue // the index stays crowded (220 of 256 words live) but never full
				}
				v := fmt.Appendf(nil, "%s@%d", k, step)
				if err := tx.Put(1, k, v); err != nil {
					return err
				}
				model[k] = v
			}
			return nil
		})
		require.NoError(t, err)
		if step%17 == 0 {
			require.NoError(t, r.Reclaim())
		}
		_, tombs := r.indexUse()
		maxTombs = max(maxTombs, tombs)
		for i := range universe {
			k := fmt.Sprint("k-", i)
			got, err := r.Get(1, k, nil)
			if want, ok := model[k]; ok {
				require.NoError(t, err, "step %d: %s", step, k)
				require.Equal(t, string(want), string(got), "step %d", step)
			} else {
				require.True(t, errors.Is(err, ErrNotFound), "step %d: %s deleted, got %q, %v", step, k, got, err)
			}
		}
	}
	stop.Store(true)
	wg.Wait()
	require.Nil(t, lost.Load(), "a stable key was not found")
	t.Logf("most tombstones at once: %d of 256 words", maxTombs)
}
