package steer

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSetGlobalFromWorker sets and clears global steering from a worker through the owner's
// OpSetGlobal handler; bad input is refused with the owner's typed error and
// changes nothing.
func TestSetGlobalFromWorker(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	owner := newOwner(t, smallCfg, Options{})
	lb := loopback{}
	owner.Serve(func(op uint16, h func([]byte) ([]byte, error)) { lb[op] = h })
	w := newReader(t, owner, Options{Caller: lb})
	_, err := w.Register("named", []Vector{{Hook: "pre_attn", Layer: 1, Scale: 1, Data: randVec(rng, smallCfg.Hidden)}})
	require.NoError(t, err)

	g := Steering{
		Base:   Tier{Vectors: []Vector{{Hook: "mlp_out", Layer: 2, Scale: 0.5, Data: randVec(rng, smallCfg.Hidden)}}, Refs: []Ref{{Name: "named", Strength: 2}}},
		Decode: Tier{Clamps: []Clamp{{Hook: "mlp_in", Layer: 0, Dir: unitVec(rng, smallCfg.Hidden), Min: -1, Max: 1, Strength: 1}}},
	}
	v, err := w.SetGlobal(g)
	require.NoError(t, err)
	s, err := w.Region().Snapshot()
	require.NoError(t, err)
	got, d, ok, err := w.Global(&s)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, v, s.Version())
	require.Equal(t, g.Base.Vectors[0].Data, got.Base.Vectors[0].Data)
	require.Equal(t, g.Base.Refs, got.Base.Refs)
	require.Len(t, got.Decode.Clamps, 1)
	s.Close()

	for _, tc := range []struct {
		name string
		g    Steering
		want error
	}{
		{"unknown ref", Steering{Base: Tier{Refs: []Ref{{Name: "nope", Strength: 1}}}}, ErrUnknownVector},
		{"hook", Steering{Base: Tier{Vectors: []Vector{{Hook: "x", Layer: 0, Scale: 1, Data: randVec(rng, smallCfg.Hidden)}}}}, ErrUnknownHook},
		{"size", Steering{Base: Tier{Vectors: []Vector{{Hook: "pre_attn", Layer: 0, Scale: 1, Data: []float32{1}}}}}, ErrHiddenSize},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := owner.Region().Version()
			_, err := w.SetGlobal(tc.g)
			require.ErrorIs(t, err, tc.want)
			require.Equal(t, before, owner.Region().Version())
		})
	}
	// A worker's bytes are not trusted: a corrupted encoding is refused by the owner.
	_, err = lb[OpSetGlobal](append([]byte{0}, "SSTR garbage"...))
	require.ErrorIs(t, err, ErrBadEncoding)

	_, err = w.SetGlobal(Steering{})
	require.NoError(t, err)
	s, err = w.Region().Snapshot()
	require.NoError(t, err)
	defer s.Close()
	_, d2, ok, err := w.Global(&s)
	require.NoError(t, err)
	require.False(t, ok)
	require.NotEqual(t, d, d2)
	// Without a Caller a worker cannot write.
	_, err = newReader(t, owner, Options{}).SetGlobal(g)
	require.ErrorIs(t, err, ErrNotOwner)
}

// TestLatchExportRestore exports a latch map built by a random sequence of operations and
// restores it into a fresh engine: the state hash (order, contents, pins, counters) is equal,
// and the restored map keeps evicting the same way.
func TestLatchExportRestore(t *testing.T) {
	for _, policy := range []LatchPolicy{FIFO, LRU} {
		rng := rand.New(rand.NewPCG(7, uint64(policy)))
		lc := LatchConfig{MaxConversations: 8, MaxLatchedBytes: 40 * 4 * 6, Policy: policy}
		a := newOwner(t, smallCfg, Options{Latch: lc})
		b := newOwner(t, smallCfg, Options{Latch: lc})
		for _, e := range []*Owner{a, b} {
			_, err := e.Register("n", []Vector{{Hook: "pre_attn", Layer: 0, Scale: 1, Data: make([]float32, smallCfg.Hidden)}})
			require.NoError(t, err)
		}
		admit := func(e *Owner, i int, seed uint64) {
			r := rand.New(rand.NewPCG(seed, 3))
			ov := &Steering{}
			if r.IntN(3) > 0 {
				ov.Base.Vectors = []Vector{{Hook: "post_attn", Layer: r.IntN(3), Scale: 1, Data: randVec(r, smallCfg.Hidden)}}
			}
			if r.IntN(2) == 0 {
				ov.Decode.Refs = []Ref{{Name: "n", Strength: 1}}
				ov.Compose = ComposeAdd
			}
			_, err := e.Admit(Admission{RequestID: "r", Conversation: ConvKey{Tenant: "t", ID: string(rune('a' + r.IntN(12)))}, Override: ov})
			require.NoError(t, err)
		}
		for i := range 200 {
			admit(a, i, rng.Uint64())
		}
		entries, st := a.Latches().Export()
		require.NoError(t, b.RestoreLatches(entries, st))
		require.Equal(t, a.Latches().StateHash(), b.Latches().StateHash())
		sa, _ := a.Status()
		sb, _ := b.Status()
		sa.Version, sb.Version, sa.ArenaUsed, sb.ArenaUsed, sa.ArenaFree, sb.ArenaFree = 0, 0, 0, 0, 0, 0
		sa.ColumnsUsed, sb.ColumnsUsed, sa.ColumnsRetired, sb.ColumnsRetired = 0, 0, 0, 0 // retired columns wait for reclamation, as arena bytes do
		sa.RequestsWithSteering, sb.RequestsWithSteering, sa.AdmittedRequests, sb.AdmittedRequests = 0, 0, 0, 0
		require.Equal(t, sa, sb)
		for i := range 100 {
			seed := rng.Uint64()
			admit(a, i, seed)
			admit(b, i, seed)
		}
		require.Equal(t, a.Latches().StateHash(), b.Latches().StateHash())

		// Inconsistent input is refused whole.
		entries, st = a.Latches().Export()
		before := b.Latches().StateHash()
		bad := st
		bad.Conversations++
		require.ErrorIs(t, b.RestoreLatches(entries, bad), ErrLatchState)
		if len(entries) > 1 {
			dup := append(append([]LatchEntry(nil), entries...), entries[0])
			st2 := st
			st2.Conversations++
			require.ErrorIs(t, b.RestoreLatches(dup, st2), ErrLatchState)
		}
		broken := append([]LatchEntry(nil), entries...)
		broken[0].Steering = Steering{Base: Tier{Vectors: []Vector{{Hook: "nope", Layer: 0, Scale: 1, Data: make([]float32, smallCfg.Hidden)}}}}
		require.ErrorIs(t, b.RestoreLatches(broken, st), ErrLatchState)
		tooMany := LatchConfig{MaxConversations: 1, Policy: policy}
		c := newOwner(t, smallCfg, Options{Latch: tooMany})
		if len(entries) > 1 {
			require.ErrorIs(t, c.RestoreLatches(entries, st), ErrLatchState)
		}
		require.Equal(t, before, b.Latches().StateHash())
	}
}
