package shm

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPinlessReadValidation walks Reader.Get's pinless read step by step: a value found and
// copied at version v validates while nothing visible at v has been reclaimed, and stops
// validating once a reclamation pass has freed the blob the copy came from, also when the
// bytes there have since been reused for another key.
func TestPinlessReadValidation(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 1024, ArenaBytes: 64 << 10, ReaderSlots: 4})
	_, err := r.Put(testKind, "req-a", []byte("value one"))
	require.NoError(t, err)
	rd, err := r.NewReader()
	require.NoError(t, err)
	defer rd.Close()
	m := rd.m.Load()

	v := ldWord(m.version)
	res, a, n := getAt(m, uint64(testKind), []byte("req-a"), v)
	require.Equal(t, uint64(resFound), res)
	require.Equal(t, "value one", string(m.arena[a:a+n]))
	require.Zero(t, ldWord(m.pin), "a read at a given version stores no pin")
	require.True(t, validAt(m, v))

	// A new version retires the blob; until a pass frees it, the read at v stays valid.
	_, err = r.Put(testKind, "req-a", []byte("value two"))
	require.NoError(t, err)
	require.True(t, validAt(m, v), "a retired blob stays intact until a pass frees it")

	require.NoError(t, r.Reclaim())
	require.Greater(t, r.Stats().ReclaimedBytes, uint64(0), "the pass freed the old blob")
	require.False(t, validAt(m, v), "the pass freed memory visible at v: the read must be dropped")
	// The pass zeroed the freed bytes, and new values reuse them: what the stale offsets hold
	// now is not the value.
	for i := range 32 {
		_, err = r.Put(testKind, fmt.Sprintf("other-%02d", i), []byte("xxxxxxxxxxxxxxxxxxxx"))
		require.NoError(t, err)
	}
	require.NotEqual(t, "value one", string(m.arena[a:a+n]))
	require.False(t, validAt(m, v))

	// The Get itself answers with the current value, pinless or not, and leaves no pin.
	got, err := rd.Get(testKind, "req-a", nil)
	require.NoError(t, err)
	require.Equal(t, "value two", string(got))
	require.Zero(t, ldWord(m.pin))
	require.True(t, validAt(m, ldWord(m.version)))

	// A busy or closed Reader does not validate.
	setState(m.state, descBusy, true)
	require.False(t, validAt(m, ldWord(m.version)))
	setState(m.state, descBusy, false)
}

// TestReaderGetsWhileRewritten: goroutines with a Reader each read while the owner rewrites
// every value, deletes some and reclaims a small arena over and over, so that pinless reads
// keep racing with passes that free and reuse what they read; every value read must be whole
// and of its key.
func TestReaderGetsWhileRewritten(t *testing.T) {
	r := smallRegion(t)
	require.NoError(t, writeGeneration(r, 1))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 4)
	var reads [4]int
	for g := range 4 {
		rd, err := r.NewReader()
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer rd.Close()
			var buf []byte
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := childKey(i % childKeys)
				var err error
				buf, err = rd.Get(testKind, k, buf[:0])
				if errors.Is(err, ErrNotFound) {
					continue
				}
				if err == nil {
					_, err = checkValue(k, buf)
				}
				if err != nil {
					errs <- err
					return
				}
				reads[g]++
			}
		}()
	}
	deadline := time.Now().Add(2 * time.Second)
	for gen := uint64(2); time.Now().Before(deadline); gen++ {
		err := writeGeneration(r, gen)
		for errors.Is(err, ErrRegionFull) {
			require.NoError(t, r.Reclaim())
			err = writeGeneration(r, gen)
		}
		require.NoError(t, err)
		if gen%4 == 0 {
			require.NoError(t, r.Reclaim())
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for g, n := range reads {
		require.Positive(t, n, "reader %d read nothing", g)
	}
	require.Greater(t, r.Stats().ReclaimedBytes, uint64(0))
}

// TestCloseWhileReadersGet closes a region while goroutines read through their Readers: each
// read answers a whole value or ErrClosed, none faults, and once the last Reader is closed the
// parked mappings are gone.
func TestCloseWhileReadersGet(t *testing.T) {
	r, err := Create(Config{IndexSlots: 1024, ArenaBytes: 4 << 20, ReaderSlots: 64})
	require.NoError(t, err)
	require.NoError(t, writeGeneration(r, 1))
	const readers = 4
	rds := make([]*Reader, readers)
	for i := range rds {
		rds[i], err = r.NewReader()
		require.NoError(t, err)
	}
	old := rds[0].m.Load()
	var wg sync.WaitGroup
	errs := make(chan error, readers)
	started := make(chan struct{}, readers)
	for _, rd := range rds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf []byte
			for i := 0; ; i++ {
				if i == 100 {
					started <- struct{}{}
				}
				k := childKey(i % childKeys)
				var err error
				buf, err = rd.Get(testKind, k, buf[:0])
				switch {
				case errors.Is(err, ErrClosed):
					return
				case errors.Is(err, ErrNotFound):
				case err != nil:
					errs <- err
					return
				default:
					if _, err := checkValue(k, buf); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	for range readers {
		<-started
	}
	require.NoError(t, r.Close())
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	r.slotMu.Lock()
	parked := r.parked
	r.slotMu.Unlock()
	require.True(t, parked, "Readers still open: the mappings are parked, not unmapped")
	// What a Get still holding the old memory would read: zeros, not a fault.
	require.Zero(t, ldWord(old.version))
	require.Equal(t, make([]byte, 64), old.arena[:64])
	for _, rd := range rds {
		_, err := rd.Get(testKind, childKey(0), nil)
		require.ErrorIs(t, err, ErrClosed)
		require.NoError(t, rd.Close())
	}
	require.False(t, r.parked)
	require.Nil(t, r.maps.data, "the last Reader's Close unmapped the parked region")
}

// TestGetHoldingTheOldMemoryAcrossClose is the interleaving that faulted under the race
// detector (pinlessGet off): a Get loads its Reader's memory, Close runs to its end (no pin
// stored yet, so none seen), then the Get's first loads (the version word, the pin store) hit
// the old ranges. Parked, they read zeros and the Get answers ErrClosed; unmapped, they faulted.
func TestGetHoldingTheOldMemoryAcrossClose(t *testing.T) {
	r, err := Create(Config{IndexSlots: 1024, ArenaBytes: 1 << 20, ReaderSlots: 8})
	require.NoError(t, err)
	require.NoError(t, writeGeneration(r, 1))
	rd, err := r.NewReader()
	require.NoError(t, err)
	k := childKey(0)
	got, err := rd.Get(testKind, k, nil)
	require.NoError(t, err)
	_, err = checkValue(k, got)
	require.NoError(t, err)
	m := rd.m.Load() // what a Get in flight holds
	require.NoError(t, r.Close())
	res, _, _ := getAt(m, uint64(testKind), []byte(k), 0) // loads m.version, stores the pin
	require.Equal(t, uint64(resRetry), uint64(res), "the parked memory reads as no version, the Reader as closed")
	_, err = rd.Get(testKind, k, nil)
	require.ErrorIs(t, err, ErrClosed)
	require.NoError(t, rd.Close())
	require.Nil(t, r.maps.data, "the last Reader's Close unmapped the parked region")
}
