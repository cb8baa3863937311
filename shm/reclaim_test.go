//go:build linux

package shm

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// holdBarrier makes the next reclamation pass's barrier in r wait until the returned release
// is called; later barriers run at once. entered is closed when a pass reaches the held barrier.
func holdBarrier(t *testing.T, r *Region) (entered <-chan struct{}, release func()) {
	t.Helper()
	in, out := make(chan struct{}), make(chan struct{})
	var once, rel sync.Once
	r.w.mu.Lock()
	orig := r.w.barrier
	r.w.barrier = func() error {
		held := false
		once.Do(func() { held = true })
		if held {
			close(in)
			<-out
		}
		return orig()
	}
	r.w.mu.Unlock()
	release = func() { rel.Do(func() { close(out) }) }
	t.Cleanup(release)
	return in, release
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		require.False(t, time.Now().After(deadline), "timed out waiting for %s", what)
	}
}

// TestReclaimOffTheWritePath holds the first reclamation pass in its barrier: writes go on
// meanwhile (an inline pass would hold the writer lock through the barrier, and the write that
// started it would wait), and once the barrier returns the pass frees what it may.
func TestReclaimOffTheWritePath(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 256, ArenaBytes: 1 << 20})
	if r.l.flags&flagMembarrier == 0 {
		t.Skip("membarrier unavailable: passes have no barrier to hold")
	}
	entered, release := holdBarrier(t, r)
	_, err := r.Put(1, "k", []byte{0})
	require.NoError(t, err)
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no background reclamation pass started")
	}
	wrote := make(chan error, 1)
	go func() {
		for i := range 256 {
			if _, err := r.Put(1, "k", []byte{byte(i)}); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	select {
	case err := <-wrote:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("writes wait for a reclamation pass's barrier: the pass is on the write path")
	}
	require.Zero(t, r.Stats().ReclaimedBytes, "nothing is freed before the barrier returns")
	release()
	waitFor(t, "the background pass to free retired blobs", func() bool { return r.Stats().ReclaimedBytes > 0 })
	waitFor(t, "the pass to end", func() bool { return load64(r.data, hReclaimSeq)&1 == 0 })
	got, err := r.Get(1, "k", nil)
	require.NoError(t, err)
	require.Equal(t, []byte{byte(255)}, got)
}

// TestReclaimInlineTakesOver runs an inline pass (Reclaim) while a background pass waits in its
// barrier: the inline pass finishes the pass, the background one then stops without touching
// anything, the pass sequence ends even and snapshots at the current version pin.
func TestReclaimInlineTakesOver(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 256, ArenaBytes: 1 << 20})
	if r.l.flags&flagMembarrier == 0 {
		t.Skip("membarrier unavailable: passes have no barrier to hold")
	}
	entered, release := holdBarrier(t, r)
	var v uint64
	for i := range 8 {
		var err error
		v, err = r.Put(1, "k", []byte{byte(i)})
		require.NoError(t, err)
	}
	<-entered
	require.EqualValues(t, 1, load64(r.data, hReclaimSeq)&1, "the background pass is in flight")
	require.NoError(t, r.Reclaim())
	require.Positive(t, r.Stats().ReclaimedBytes, "the inline pass freed what the background one would have")
	require.Zero(t, load64(r.data, hReclaimSeq)&1, "the inline pass ended the pass")
	seq := load64(r.data, hReclaimSeq)
	release()
	waitFor(t, "the background pass to stop", func() bool {
		r.w.mu.Lock()
		defer r.w.mu.Unlock()
		return !r.w.passing
	})
	require.Equal(t, seq, load64(r.data, hReclaimSeq), "the overtaken pass changed nothing")
	s, err := r.SnapshotAt(v)
	require.NoError(t, err)
	s.Close()
}

// TestMarkersWaitForConfirmedHorizon: while a pass waits in its barrier the horizon is raised
// but not yet confirmed by the slot scan, so a commit then must not unlink deletion markers a
// pinned reader may still need: a snapshot from before the deletion still reads the value.
func TestMarkersWaitForConfirmedHorizon(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 256, ArenaBytes: 1 << 20})
	if r.l.flags&flagMembarrier == 0 {
		t.Skip("membarrier unavailable: passes have no barrier to hold")
	}
	_, err := r.Put(1, "gone", []byte("old"))
	require.NoError(t, err)
	snap, err := r.Snapshot()
	require.NoError(t, err)
	defer snap.Close()
	_, err = r.Delete(1, "gone")
	require.NoError(t, err)
	entered, release := holdBarrier(t, r)
	for i := range 8 {
		_, err := r.Put(1, "other", []byte{byte(i)})
		require.NoError(t, err)
	}
	<-entered
	for i := range 8 { // commits inside the window unlink whatever the horizon allows
		_, err := r.Put(1, "other", []byte{byte(i)})
		require.NoError(t, err)
	}
	got, err := snap.Get(1, "gone", nil)
	require.NoError(t, err, "a pinned snapshot from before the deletion lost its value")
	require.Equal(t, []byte("old"), got)
	release()
}

// TestSnapshotAtStalledPass: a reclamation pass that never ends (what an owner killed in the
// middle of one leaves) makes SnapshotAt of an older version fail with ErrReclaimStalled after
// the bound, instead of spinning for ever, and frees the slot it held; once the pass ends, the
// current version pins again.
func TestSnapshotAtStalledPass(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 256, ArenaBytes: 1 << 20})
	if r.l.flags&flagMembarrier == 0 {
		t.Skip("membarrier unavailable: passes have no barrier to hold")
	}
	defer func(d time.Duration) { reclaimStall = d }(reclaimStall)
	reclaimStall = 50 * time.Millisecond
	old, err := r.Put(1, "a", []byte{1})
	require.NoError(t, err)
	entered, release := holdBarrier(t, r)
	var v uint64
	for i := range 8 {
		v, err = r.Put(1, "k", []byte{byte(i)})
		require.NoError(t, err)
	}
	<-entered
	require.EqualValues(t, 1, load64(r.data, hReclaimSeq)&1, "the pass is in flight")
	for range 3 * maxLocalSlots { // more than the process's slots: each failure gives its slot back
		_, err = r.SnapshotAt(old)
		require.ErrorIs(t, err, ErrReclaimStalled)
	}
	release()
	waitFor(t, "the pass to end", func() bool { return load64(r.data, hReclaimSeq)&1 == 0 })
	s, err := r.SnapshotAt(v)
	require.NoError(t, err)
	s.Close()
}
