//go:build linux

package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestAllocatorReusesAndCoalesces(t *testing.T) {
	const size = 1 << 20
	a := newAllocator(size)
	rng := rand.New(rand.NewPCG(1, 2))
	type ext struct{ off, n uint64 }
	var live []ext
	owner := make([]int, size/blobAlign) // which extent holds each unit: catches overlaps
	for i := 0; i < 20000; i++ {
		if len(live) > 0 && (rng.IntN(2) == 0 || a.free() < 8192) {
			j := rng.IntN(len(live))
			e := live[j]
			for u := e.off / blobAlign; u < (e.off+e.n)/blobAlign; u++ {
				owner[u] = 0
			}
			a.release(e.off, e.n)
			live = append(live[:j], live[j+1:]...)
			continue
		}
		n := uint64(1+rng.IntN(64)) * blobAlign
		off, ok := a.alloc(n, size)
		if !ok {
			continue
		}
		require.Zero(t, off%blobAlign)
		require.LessOrEqual(t, off+n, uint64(size))
		for u := off / blobAlign; u < (off+n)/blobAlign; u++ {
			require.Zero(t, owner[u], "extent at %d overlaps a live one", off)
			owner[u] = i + 1
		}
		live = append(live, ext{off, n})
	}
	for _, e := range live {
		a.release(e.off, e.n)
	}
	require.Zero(t, a.used)
	require.Zero(t, a.top, "every extent coalesced back into the bump region")
	require.Empty(t, a.byStart)
	_, ok := a.alloc(size, size)
	require.True(t, ok, "the whole arena is one extent again")
}

func TestAllocatorLimit(t *testing.T) {
	a := newAllocator(4096)
	_, ok := a.alloc(4096, 4096-64)
	require.False(t, ok, "limit keeps a reserve")
	_, ok = a.alloc(4096-64, 4096-64)
	require.True(t, ok)
	_, ok = a.alloc(64, 4096)
	require.True(t, ok, "the reserve is there for callers allowed to use it")
}

func TestKeyHashKeyedAndSpread(t *testing.T) {
	a := keyHash(1, 2, 1, []byte("request-1"))
	require.NotEqual(t, a, keyHash(3, 2, 1, []byte("request-1")), "salt k0 changes the hash")
	require.NotEqual(t, a, keyHash(1, 4, 1, []byte("request-1")), "salt k1 changes the hash")
	require.NotEqual(t, a, keyHash(1, 2, 2, []byte("request-1")), "kind changes the hash")
	// Every length up to 40 and sequential ids spread evenly over 256 buckets.
	const n = 1 << 16
	var buckets [256]int
	for i := 0; i < n; i++ {
		key := fmt.Sprintf("%0*d", 1+i%40, i)
		buckets[keyHash(0x1234, 0x5678, 1, []byte(key))&255]++
	}
	for b, c := range buckets {
		require.InDelta(t, n/256, c, n/256/4, "bucket %d", b)
	}
	// Keys differing in one bit anywhere differ in the fingerprint (top 32 bits) too.
	base := []byte("0123456789abcdef0123456789abcdef0123")
	for i := range base {
		for bit := 0; bit < 8; bit++ {
			k := append([]byte(nil), base...)
			k[i] ^= 1 << bit
			require.NotEqual(t, keyHash(9, 9, 1, base)>>32, keyHash(9, 9, 1, k)>>32, "byte %d bit %d", i, bit)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	for _, cfg := range []Config{
		{IndexSlots: 100},
		{IndexSlots: 32},
		{ArenaBytes: 1000},
		{ArenaBytes: 1 << 10},
		{ReaderSlots: -1},
		{ReaderSlots: maxReaderSlots + 1},
		{MaxProbe: -1},
		{IndexSlots: 64, MaxProbe: 65},
		{UserConfig: make([]byte, UserConfigSize+1)},
	} {
		_, err := Create(cfg)
		require.ErrorIs(t, err, ErrBadConfig, "%+v", cfg)
	}
}

func TestOpenRejectsBadFiles(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 64, ArenaBytes: 64 << 10, ReaderSlots: 4, UserConfig: []byte("model")})
	data, readers := r.Files()

	rd, err := Open(data, readers)
	require.NoError(t, err)
	require.Equal(t, "model", string(rd.UserConfig()[:5]))
	require.Equal(t, r.ID(), rd.ID())
	_, err = rd.Put(1, "k", nil)
	require.ErrorIs(t, err, ErrReadOnly)
	require.NoError(t, rd.Close())
	require.ErrorIs(t, rd.Close(), ErrClosed)

	_, err = Open(readers, readers)
	require.ErrorIs(t, err, ErrNotRegion, "reader file is not a data file")
	_, err = Open(nil, readers)
	require.ErrorIs(t, err, ErrNotRegion)

	other := newTestRegion(t, Config{IndexSlots: 64, ArenaBytes: 64 << 10, ReaderSlots: 4})
	_, oreaders := other.Files()
	_, err = Open(data, oreaders)
	require.Error(t, err, "reader file of another region")

	f, err := os.CreateTemp(t.TempDir(), "plain")
	require.NoError(t, err)
	defer f.Close()
	_, err = Open(f, f)
	require.ErrorIs(t, err, ErrNotRegion, "an unsealed file could shrink under the mapping")

	// The data mapping really is read-only in readers: the memfd refuses a writable mapping.
	_, err = unix.Mmap(int(data.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.Error(t, err)
}

func TestSnapshotAt(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 256, ArenaBytes: 1 << 20})
	v1, err := r.Put(1, "k", []byte("v1"))
	require.NoError(t, err)
	held, err := r.SnapshotAt(v1) // another rank would pin v1 the same way
	require.NoError(t, err)
	for i := 0; i < 100; i++ {
		_, err := r.Put(1, "k", []byte(fmt.Sprint("v", i+2)))
		require.NoError(t, err)
	}
	require.NoError(t, r.Reclaim())
	again, err := r.SnapshotAt(v1)
	require.NoError(t, err, "v1 is still held by a snapshot")
	got, err := again.Get(1, "k", nil)
	require.NoError(t, err)
	require.Equal(t, "v1", string(got))
	again.Close()
	held.Close()
	require.NoError(t, r.Reclaim())
	_, err = r.SnapshotAt(v1)
	require.ErrorIs(t, err, ErrSnapshotTooOld)
	_, err = r.SnapshotAt(r.Version() + 1)
	require.ErrorIs(t, err, ErrSnapshotFuture)
}

func TestReaderBusyAndClose(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 64, ArenaBytes: 64 << 10, ReaderSlots: 2})
	_, err := r.Put(1, "k", []byte("v"))
	require.NoError(t, err)
	rd, err := r.NewReader()
	require.NoError(t, err)
	s, err := rd.Snapshot()
	require.NoError(t, err)
	_, err = rd.Get(1, "k", nil)
	require.ErrorIs(t, err, ErrReaderBusy)
	s.Close()
	got, err := rd.Get(1, "k", nil)
	require.NoError(t, err)
	require.Equal(t, "v", string(got))
	rd2, err := r.NewReader()
	require.NoError(t, err)
	_, err = r.NewReader()
	require.ErrorIs(t, err, ErrNoReaderSlot)
	require.NoError(t, rd.Close())
	require.NoError(t, rd2.Close())
	require.Equal(t, uint64(0), r.Stats().ReadersClaimed)
}

func TestIndexFullAndDeleteReserve(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 64, ArenaBytes: 64 << 10, MaxProbe: 64})
	n := 0
	for ; ; n++ {
		_, err := r.Put(1, fmt.Sprint("key-", n), make([]byte, 8))
		if err != nil {
			require.ErrorIs(t, err, ErrRegionFull)
			break
		}
	}
	require.Equal(t, 64, n, "every index word used")
	// A full region can always be emptied: deletes use the reserve.
	for i := 0; i < n; i++ {
		_, err := r.Delete(1, fmt.Sprint("key-", i))
		require.NoError(t, err)
	}
	require.NoError(t, r.Reclaim())
	require.NoError(t, r.Reclaim())
	st := r.Stats()
	require.Zero(t, st.Entries)
	require.Zero(t, st.AllocBytes, "markers unlinked and reclaimed: %+v", st)
	_, err := r.Put(1, "again", []byte("v"))
	require.NoError(t, err, "tombstones are reused")
}

func TestTxSemantics(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 256, ArenaBytes: 1 << 20})
	_, err := r.Put(1, "old", []byte("x"))
	require.NoError(t, err)
	_, err = r.Update(func(tx *Tx) error {
		require.NoError(t, tx.Put(1, "a", []byte("1")))
		require.NoError(t, tx.Put(1, "a", []byte("2")), "second write of a key replaces the first")
		require.NoError(t, tx.Put(1, "b", []byte("b")))
		require.NoError(t, tx.Delete(1, "b"), "created and deleted in one Tx")
		require.ErrorIs(t, tx.Delete(1, "b"), ErrNotFound)
		require.NoError(t, tx.Delete(1, "old"))
		require.NoError(t, tx.Put(1, "old", []byte("y")), "deleted and re-put in one Tx")
		return nil
	})
	require.NoError(t, err)
	for k, want := range map[string]string{"a": "2", "old": "y"} {
		got, err := r.Get(1, k, nil)
		require.NoError(t, err)
		require.Equal(t, want, string(got))
	}
	_, err = r.Get(1, "b", nil)
	require.ErrorIs(t, err, ErrNotFound)
	require.Equal(t, uint64(2), r.Stats().Entries)
}

// TestConcurrentGoroutines runs readers in goroutines of the owner process under -race.
func TestConcurrentGoroutines(t *testing.T) {
	r := smallRegion(t)
	require.NoError(t, writeGeneration(r, 1))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 8)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf []byte
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				s, err := r.Snapshot()
				if err != nil {
					errs <- err
					return
				}
				gv, _, err := s.View(testKind, genKey)
				if err != nil {
					s.Close()
					errs <- err
					return
				}
				gen := binary.LittleEndian.Uint64(gv)
				k := childKey(i % childKeys)
				buf, err = s.Get(testKind, k, buf[:0])
				s.Close()
				if err == nil {
					if vg, err := checkValue(k, buf); err != nil || vg != gen {
						errs <- fmt.Errorf("%s: gen %d want %d: %v", k, vg, gen, err)
						return
					}
				}
			}
		}()
	}
	stopped := false
	stopReaders := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer stopReaders() // even if an assertion fails, before cleanup unmaps the region
	for gen := uint64(2); gen < 300; gen++ {
		err := writeGeneration(r, gen)
		for errors.Is(err, ErrRegionFull) { // snapshots pin memory: back off
			time.Sleep(100 * time.Microsecond)
			err = writeGeneration(r, gen)
		}
		require.NoError(t, err)
	}
	stopReaders()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

func TestCloseWaitsForReaders(t *testing.T) {
	r, err := Create(Config{IndexSlots: 64, ArenaBytes: 64 << 10})
	require.NoError(t, err)
	_, err = r.Put(1, "k", []byte("v"))
	require.NoError(t, err)
	s, err := r.Snapshot()
	require.NoError(t, err)
	view, _, err := s.View(1, "k")
	require.NoError(t, err)

	saved := closeWait
	closeWait = 20 * time.Millisecond
	defer func() { closeWait = saved }()
	require.ErrorIs(t, r.Close(), ErrBusy, "a snapshot is open: the mapping must stay")
	require.Equal(t, "v", string(view), "the open snapshot's view is still readable")
	_, err = r.Get(1, "k", nil)
	require.ErrorIs(t, err, ErrClosed, "no new reads after Close")

	r2, err := Create(Config{IndexSlots: 64, ArenaBytes: 64 << 10})
	require.NoError(t, err)
	s2, err := r2.Snapshot()
	require.NoError(t, err)
	closeWait = 5 * time.Second
	go func() { time.Sleep(10 * time.Millisecond); s2.Close() }()
	require.NoError(t, r2.Close(), "Close waits for the snapshot to finish")
	s.Close()
}

// TestCorruptRegionGivesErrors scribbles over index words and blob headers in the owner's
// mapping: every read must return ErrCorrupt or a clean miss, never fault.
func TestCorruptRegionGivesErrors(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for round := 0; round < 200; round++ {
		r, err := Create(Config{IndexSlots: 64, ArenaBytes: 64 << 10})
		require.NoError(t, err)
		for i := 0; i < 20; i++ {
			_, err := r.Put(1, fmt.Sprint("k", i), make([]byte, 8+i*40))
			require.NoError(t, err)
		}
		target := r.arena[:4096]
		if round%2 == 0 {
			target = r.index
		}
		for n := 0; n < 4; n++ {
			store64(target, uint64(rng.IntN(len(target)/8))*8, rng.Uint64()>>uint(rng.IntN(64)))
		}
		rd, err := r.NewReader()
		require.NoError(t, err)
		for i := 0; i < 20; i++ {
			_, err := rd.Get(1, fmt.Sprint("k", i), nil)
			if err != nil && !errors.Is(err, ErrNotFound) {
				require.ErrorIs(t, err, ErrCorrupt)
			}
		}
		s, err := rd.Snapshot()
		require.NoError(t, err)
		if err := s.Check(); err != nil {
			require.ErrorIs(t, err, ErrCorrupt)
		}
		s.Range(1, func(_, _ []byte, _ uint64) bool { return true })
		s.Close()
		rd.Close()
		r.Close()
	}
}

// A region written by a build of another layout (4: the hash without its final avalanche,
// whose index this build would probe in the wrong places; 3: no column pool, its checksum where
// the pool's offset now is; 2: the one-lane hash) is refused with the typed error, whatever else
// checks out.
func TestOldLayoutRefused(t *testing.T) {
	for _, old := range []uint64{4, 3, 2} {
		h := validHeader()
		_, err := parseHeader(h, computeLayout(64, 64, 64<<10, 4, 64).totalSize)
		require.NoError(t, err)
		binary.LittleEndian.PutUint64(h[hLayout:], old|headerSize<<32)
		_, err = parseHeader(h, computeLayout(64, 64, 64<<10, 4, 64).totalSize)
		require.ErrorIs(t, err, ErrIncompatible)
		require.ErrorContains(t, err, fmt.Sprintf("region has layout %d, this build reads %d", old, LayoutVersion))
	}
}

// A Reader used after its Region closed answers ErrClosed: its Get, Snapshot and Close touch
// nothing of the unmapped region (they crashed with a fault before).
func TestReaderAfterRegionClose(t *testing.T) {
	r, err := Create(Config{IndexSlots: 64, ArenaBytes: 64 << 10, ReaderSlots: 2})
	require.NoError(t, err)
	_, err = r.Put(1, "k", []byte("v"))
	require.NoError(t, err)
	rd, err := r.NewReader()
	require.NoError(t, err)
	got, err := rd.Get(1, "k", nil)
	require.NoError(t, err)
	require.Equal(t, "v", string(got))
	require.NoError(t, r.Close())
	for range 2 {
		_, err = rd.Get(1, "k", nil)
		require.ErrorIs(t, err, ErrClosed)
		_, err = rd.Get(1, "missing", nil)
		require.ErrorIs(t, err, ErrClosed)
		_, err = rd.Snapshot()
		require.ErrorIs(t, err, ErrClosed)
	}
	require.NoError(t, rd.Close())
	_, err = rd.Get(1, "k", nil)
	require.ErrorIs(t, err, ErrClosed)
}

// A closing Region marks its Readers' state words before it waits out their pins; the
// generated reader's getAt checks that word after it pins, in Go as in C, so a Get that pins
// after the mark answers ErrClosed and leaves no pin, whether the Reader's word is its
// descriptor's or (without a descriptor) its own.
func TestReaderStateWordCloses(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 64, ArenaBytes: 64 << 10, ReaderSlots: 4})
	_, err := r.Put(1, "k", []byte("v"))
	require.NoError(t, err)
	for _, withDesc := range []bool{true, false} {
		rd, err := r.NewReader()
		require.NoError(t, err)
		if !withDesc {
			m := rd.m.Load()
			m.state = &m.ownState
			freeDesc(rd.desc)
			rd.desc = nil
		}
		got, err := rd.Get(1, "k", nil)
		require.NoError(t, err)
		require.Equal(t, "v", string(got))
		r.closed.Store(true) // as Close does first, then it marks the Readers
		rd.setDescState(descClosed, true)
		_, err = rd.Get(1, "k", nil)
		require.ErrorIs(t, err, ErrClosed, "descriptor %v", withDesc)
		require.Zero(t, atomic.LoadUint64(rd.m.Load().pin), "a pin left behind")
		rd.setDescState(descClosed, false)
		r.closed.Store(false)
		require.NoError(t, rd.Close())
	}
}

// TestKeyHashDoesNotCluster: keys of one shape (request ids that differ in their last bytes,
// two kinds each), as many as half an index of 4,096 words, hashed with 500 salts, probe as
// random 64-bit hashes do: no probe past 64 words (random hashes of as many keys pass 64 in none
// of 2,000 trials). Three shapes: 10-byte ids behind a shared 7-byte prefix, 16-byte ids
// (zero-padded numbers) and 36-byte UUID-like ids that differ in their last 4 hex digits. The
// hash of layout 4 (no final avalanche) probed up to 281 words for the first shape and past 64
// for six of the salts, so such a region refused writes (ErrRegionFull) at 40% of its index
// under the old probe bound of 64; the bound (DefaultMaxProbe) stays far above either.
func TestKeyHashDoesNotCluster(t *testing.T) {
	const slots, trials = 4096, 500
	shapes := map[string]func(i int) []byte{
		"other/r%d":  func(i int) []byte { return fmt.Appendf(nil, "other/r%d", i) },
		"req-%012d":  func(i int) []byte { return fmt.Appendf(nil, "req-%012d", i) },
		"uuid, last": func(i int) []byte { return fmt.Appendf(nil, "5f0c2a9e-1b7d-4c3a-9e21-7d4b3a10%04x", i) },
	}
	for name, shape := range shapes {
		rng := rand.New(rand.NewPCG(1, 2))
		var keys [][]byte
		for i := range slots / 4 {
			keys = append(keys, shape(i))
		}
		worst, over64 := 0, 0
		for range trials {
			k0, k1 := rng.Uint64(), rng.Uint64()
			used := make([]bool, slots)
			longest := 0
			for _, key := range keys {
				for kind := uint64(1); kind <= 2; kind++ {
					h := keyHash(k0, k1, kind, key)
					for i := 0; ; i++ {
						if s := (h + uint64(i)) & (slots - 1); !used[s] {
							used[s] = true
							longest = max(longest, i+1)
							break
						}
					}
				}
			}
			worst = max(worst, longest)
			if longest > 64 {
				over64++
			}
		}
		t.Logf("%s: %d salts: longest probe %d; over 64 words in %d", name, trials, worst, over64)
		require.Zero(t, over64, "%s: salts whose longest probe passes 64 words (longest %d)", name, worst)
	}
}
