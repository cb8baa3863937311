//go:build linux

package shm

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// within runs fn and fails the test if it has not returned after d (it used to spin for ever).
func within(t *testing.T, d time.Duration, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); fn() }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not return within %v (spinning?)", what, d)
	}
}

// TestSnapshotsExhaustLocalSlots: a process holding as many snapshots as it pins at once gets
// ErrNoReaderSlot from the next snapshot and Get, at once, instead of spinning on a slot that
// only its own Close can free; closing one makes room. Short concurrent Gets beyond the local
// slots still wait their turn instead of failing.
func TestSnapshotsExhaustLocalSlots(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 64, ArenaBytes: 64 << 10, ReaderSlots: 256})
	_, err := r.Put(1, "k", []byte("v"))
	require.NoError(t, err)
	var snaps []Snapshot
	for range maxLocalSlots {
		s, err := r.Snapshot()
		require.NoError(t, err)
		snaps = append(snaps, s)
	}
	within(t, 10*time.Second, "Snapshot with every local slot held", func() {
		_, err = r.Snapshot()
	})
	require.ErrorIs(t, err, ErrNoReaderSlot)
	require.Contains(t, err.Error(), "open snapshots")
	within(t, 10*time.Second, "Get with every local slot held", func() {
		_, err = r.Get(1, "k", nil)
	})
	require.ErrorIs(t, err, ErrNoReaderSlot)
	within(t, 10*time.Second, "SnapshotAt with every local slot held", func() {
		_, err = r.SnapshotAt(snaps[0].Version())
	})
	require.ErrorIs(t, err, ErrNoReaderSlot)

	snaps[0].Close()
	got, err := r.Get(1, "k", nil)
	require.NoError(t, err)
	require.Equal(t, "v", string(got))
	s, err := r.Snapshot()
	require.NoError(t, err)
	snaps[0] = s
	for i := range snaps {
		snaps[i].Close()
	}

	// 63 snapshots held and 8 goroutines reading: the one free slot is shared, nobody fails.
	for i := range maxLocalSlots - 1 {
		snaps[i], err = r.Snapshot()
		require.NoError(t, err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8*200)
	within(t, 30*time.Second, "concurrent Gets sharing one slot", func() {
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 200 {
					if _, err := r.Get(1, "k", nil); err != nil {
						errs <- err
					}
				}
			}()
		}
		wg.Wait()
	})
	close(errs)
	for err := range errs {
		t.Fatalf("a short Get failed while a slot was only busy: %v", err)
	}
	for i := range maxLocalSlots - 1 {
		snaps[i].Close()
	}
}
