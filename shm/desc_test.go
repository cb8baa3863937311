//go:build linux

package shm

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A Reader's descriptor carries its geometry and pin word, and its state word follows the
// Reader: usable when open, busy while a Snapshot of it is open, closed once the Reader or its
// Region closes (the C reader of capi checks it where the Go reader checks closed).
func TestReaderDescriptor(t *testing.T) {
	r := newTestRegion(t, Config{})
	rd, err := r.NewReader()
	require.NoError(t, err)
	require.NotNil(t, rd.desc)
	d := rd.desc[:]
	require.NotZero(t, rd.Descriptor())
	require.Equal(t, uint64(0), load64(d, dState))
	require.Equal(t, addrOf(r.readers, rd.slot+slotPin), load64(d, dPin))
	require.Equal(t, addrOf(r.data, hVersion), load64(d, dVersion))
	require.Equal(t, addrOf(r.index, 0), load64(d, dIndex))
	require.Equal(t, addrOf(r.arena, 0), load64(d, dArena))
	require.Equal(t, uint64(len(r.arena)), load64(d, dArenaSize))
	require.Equal(t, r.l.indexSlots-1, load64(d, dIndexMask))
	require.Equal(t, r.l.maxProbe, load64(d, dMaxProbe))
	require.Equal(t, r.l.hashK0, load64(d, dHashK0))
	require.Equal(t, r.l.hashK1, load64(d, dHashK1))
	require.Equal(t, hashK2(r.l.hashK0, r.l.hashK1), load64(d, dHashK2))
	require.Equal(t, rd.m.Load().relaxed, load64(d, dRelaxed))
	require.Equal(t, r.relaxed, rd.m.Load().relaxed == 1)
	for k := range Kind(seededKinds) {
		require.Equal(t, kindSeed(r.l.hashK0, r.l.hashK1, uint64(k)), load64(d, dSeeds+8*uint64(k)))
	}

	s, err := rd.Snapshot()
	require.NoError(t, err)
	require.Equal(t, uint64(descBusy), load64(d, dState))
	s.Close()
	require.Equal(t, uint64(0), load64(d, dState))

	require.NoError(t, r.Close())
	require.Equal(t, uint64(descClosed), load64(d, dState), "Region.Close marks its Readers' descriptors")
	require.NoError(t, rd.Close())
	require.Zero(t, rd.Descriptor())
}
