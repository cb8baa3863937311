package steer

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func byValue(nFloats int) *Steering {
	return &Steering{Base: Tier{Vectors: []Vector{{Hook: "pre_attn", Scale: 1, Data: make([]float32, nFloats)}}}}
}

func byRef(names ...string) *Steering {
	s := &Steering{}
	for _, n := range names {
		s.Decode.Refs = append(s.Decode.Refs, Ref{Name: n, Strength: 1})
	}
	return s
}

func ck(id string) ConvKey { return ConvKey{Tenant: "t", ID: id} }

func noRefs(string) (Digest, bool) { return Digest{}, false }

func TestLatchCountCapFIFO(t *testing.T) {
	l := NewLatches(LatchConfig{MaxConversations: 3, Logf: t.Logf})
	for i := range 5 {
		require.True(t, l.Trigger(ck(fmt.Sprint(i)), byValue(4), nil))
	}
	require.Equal(t, []ConvKey{ck("2"), ck("3"), ck("4")}, l.Keys())
	// A bridge does not refresh recency under FIFO.
	_, ok := l.Bridge(ck("2"), noRefs)
	require.True(t, ok)
	require.True(t, l.Trigger(ck("5"), byValue(4), nil))
	require.Equal(t, []ConvKey{ck("3"), ck("4"), ck("5")}, l.Keys())
	// Re-triggering a conversation makes it the newest latch.
	require.True(t, l.Trigger(ck("3"), byValue(4), nil))
	require.Equal(t, []ConvKey{ck("4"), ck("5"), ck("3")}, l.Keys())
	st := l.Stats()
	require.Equal(t, 3, st.Conversations)
	require.Equal(t, int64(3*16), st.Bytes)
	require.Equal(t, uint64(3), st.Evictions)
	require.Equal(t, uint64(7), st.Triggers)
	require.Equal(t, uint64(1), st.Bridges)
	_, ok = l.Bridge(ck("0"), noRefs)
	require.False(t, ok, "evicted")
}

func TestLatchCountCapLRU(t *testing.T) {
	l := NewLatches(LatchConfig{MaxConversations: 3, Policy: LRU, Logf: t.Logf})
	for i := range 3 {
		l.Trigger(ck(fmt.Sprint(i)), byValue(4), nil)
	}
	_, ok := l.Bridge(ck("0"), noRefs) // refreshes 0
	require.True(t, ok)
	l.Trigger(ck("3"), byValue(4), nil)
	require.Equal(t, []ConvKey{ck("2"), ck("0"), ck("3")}, l.Keys(), "1 was least recently used")
}

func TestLatchByteCap(t *testing.T) {
	l := NewLatches(LatchConfig{MaxConversations: 100, MaxLatchedBytes: 100, Logf: t.Logf})
	require.True(t, l.Trigger(ck("a"), byValue(10), nil)) // 40
	require.True(t, l.Trigger(ck("b"), byValue(10), nil)) // 80
	require.True(t, l.Trigger(ck("r"), byRef("x"), []Pin{{Name: "x"}}))
	require.Equal(t, int64(80), l.Stats().Bytes, "by-reference latches cost 0 bytes")
	// 80 + 60 > 100: evict oldest-first (a), then it fits (b + c = 100).
	require.True(t, l.Trigger(ck("c"), byValue(15), nil))
	require.Equal(t, []ConvKey{ck("b"), ck("r"), ck("c")}, l.Keys())
	require.Equal(t, int64(100), l.Stats().Bytes)
	// A latch of exactly the cap evicts every by-value latch, and the by-ref one too since
	// eviction is oldest-first whatever each costs.
	require.True(t, l.Trigger(ck("d"), byValue(25), nil))
	require.Equal(t, []ConvKey{ck("d")}, l.Keys())
	require.Equal(t, uint64(4), l.Stats().Evictions)
}

func TestLatchOversizeRefused(t *testing.T) {
	var logs []string
	l := NewLatches(LatchConfig{MaxLatchedBytes: 100, Logf: func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) }})
	require.True(t, l.Trigger(ck("a"), byValue(10), nil))
	require.True(t, l.Trigger(ck("b"), byValue(10), nil))
	for range 5 {
		require.False(t, l.Trigger(ck("a"), byValue(26), nil)) // 104 bytes > cap alone
	}
	st := l.Stats()
	require.Equal(t, uint64(5), st.OversizeRefusals)
	require.Equal(t, uint64(0), st.Evictions, "refusal evicts nobody else")
	require.Equal(t, []ConvKey{ck("b")}, l.Keys(), "a's older latch is dropped")
	require.Len(t, logs, 1, "the warning is rate-limited")
}

func TestLatchDigestMismatchDrops(t *testing.T) {
	d1, d2 := Digest{1}, Digest{2}
	cur := map[string]Digest{"x": d1, "y": d1}
	lookup := func(n string) (Digest, bool) { d, ok := cur[n]; return d, ok }
	l := NewLatches(LatchConfig{Logf: t.Logf})
	require.True(t, l.Trigger(ck("c1"), byRef("x", "y"), []Pin{{"x", d1}, {"y", d1}}))
	require.True(t, l.Trigger(ck("c2"), byRef("y"), []Pin{{"y", d1}}))
	_, ok := l.Bridge(ck("c1"), lookup)
	require.True(t, ok)

	cur["x"] = d2 // re-registered with other content
	_, ok = l.Bridge(ck("c1"), lookup)
	require.False(t, ok)
	delete(cur, "y") // unregistered
	_, ok = l.Bridge(ck("c2"), lookup)
	require.False(t, ok)
	st := l.Stats()
	require.Equal(t, uint64(2), st.BridgeDrops)
	require.Equal(t, uint64(1), st.Bridges)
	require.Zero(t, st.Conversations)
}

func TestLatchTenantIsolation(t *testing.T) {
	l := NewLatches(LatchConfig{Logf: t.Logf})
	a, b := ConvKey{Tenant: "a", ID: "same"}, ConvKey{Tenant: "b", ID: "same"}
	require.True(t, l.Trigger(a, byValue(1), nil))
	_, ok := l.Bridge(b, noRefs)
	require.False(t, ok)
	require.True(t, l.Trigger(b, byValue(2), nil))
	sa, _ := l.Bridge(a, noRefs)
	sb, _ := l.Bridge(b, noRefs)
	require.Len(t, sa.Base.Vectors[0].Data, 1)
	require.Len(t, sb.Base.Vectors[0].Data, 2)
	require.False(t, l.Drop(ConvKey{ID: "same"}))
	require.Equal(t, 2, l.Stats().Conversations)
}

func TestLatchCopiesInput(t *testing.T) {
	l := NewLatches(LatchConfig{})
	s := byValue(3)
	l.Trigger(ck("c"), s, nil)
	s.Base.Vectors[0].Data[0] = 42
	got, _ := l.Bridge(ck("c"), noRefs)
	require.Zero(t, got.Base.Vectors[0].Data[0])
}

// latchOps replays a pseudo-random latch workload from seed and returns the state hash after
// every operation; the sequence, not the process, determines the state.
func latchOps(seed uint64, n int, policy LatchPolicy) []uint64 {
	rng := rand.New(rand.NewPCG(seed, 99))
	l := NewLatches(LatchConfig{MaxConversations: 16, MaxLatchedBytes: 2000, Policy: policy, Logf: func(string, ...any) {}})
	digests := map[string]Digest{}
	lookup := func(n string) (Digest, bool) { d, ok := digests[n]; return d, ok }
	var out []uint64
	for range n {
		k := ConvKey{Tenant: fmt.Sprint(rng.IntN(3)), ID: fmt.Sprint(rng.IntN(24))}
		switch op := rng.IntN(10); {
		case op < 4:
			s := byValue(1 + rng.IntN(200))
			s.Base.Vectors[0].Data[0] = float32(rng.NormFloat64())
			l.Trigger(k, s, nil)
		case op < 6:
			name := fmt.Sprint("v", rng.IntN(4))
			if _, ok := digests[name]; !ok {
				digests[name] = Digest{byte(rng.IntN(256))}
			}
			l.Trigger(k, byRef(name), []Pin{{name, digests[name]}})
		case op < 9:
			l.Bridge(k, lookup)
		default:
			name := fmt.Sprint("v", rng.IntN(4))
			if rng.IntN(2) == 0 {
				delete(digests, name)
			} else {
				digests[name] = Digest{byte(rng.IntN(256))}
			}
		}
		out = append(out, l.StateHash())
	}
	return out
}

func TestLatchDeterministicInProcess(t *testing.T) {
	for _, p := range []LatchPolicy{FIFO, LRU} {
		a, b := latchOps(7, 3000, p), latchOps(7, 3000, p)
		require.Equal(t, a, b)
		require.NotEqual(t, a, latchOps(8, 3000, p))
	}
}
