package steer

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/shm"
)

// BenchmarkAdmit times the owner's Admit at the shape (32 layers × 4096 floats at
// post_block, decode tier) for an inline override, a reference to a named vector of that shape,
// and no steering; each admission is ended again (untimed) so the region stays the same size.
// Run:
//
//	go test -run '^$' -bench BenchmarkAdmit -benchmem -count 5 ./steer/
func BenchmarkAdmit(b *testing.B) {
	const D, L = 4096, 32
	cfg := ModelConfig{Hidden: D, Layers: L}
	rc, err := RegionConfig(cfg, shm.Config{IndexSlots: 1 << 12, ArenaBytes: 256 << 20, ReaderSlots: 64})
	require.NoError(b, err)
	r, err := shm.Create(rc)
	require.NoError(b, err)
	b.Cleanup(func() { r.Close() })
	e, err := Open(r, &cfg, Options{Logf: b.Logf})
	require.NoError(b, err)
	rng := rand.New(rand.NewPCG(1, 2))
	vecs := make([]Vector, L)
	for l := range vecs {
		vecs[l] = Vector{Hook: "post_block", Layer: l, Scale: 1, Data: randVec(rng, D)}
	}
	_, err = e.Register("named", vecs)
	require.NoError(b, err)
	cases := []struct {
		name string
		over *Steering
	}{
		{"inline", &Steering{Decode: Tier{Vectors: vecs}}},
		{"named", &Steering{Decode: Tier{Refs: []Ref{{Name: "named", Strength: 1}}}}},
		{"none", nil},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				id := fmt.Sprint(c.name, "-", i)
				if _, err := e.Admit(Admission{RequestID: id, Override: c.over}); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if _, err := e.End(id); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// BenchmarkAdmitChurned times an admission and its end (one inline vector, hidden 1024) in a
// region of the default size, fresh and after 300,000 requests admitted and ended: the index's
// tombstones are emptied as they pile up (shm's sweepTombstones), so the second costs what the
// first does; without the sweep it cost 2.2x (19.6 against 43.6 µs a pair). Run:
//
//	go test -run '^$' -bench BenchmarkAdmitChurned -count 5 ./steer/
func BenchmarkAdmitChurned(b *testing.B) {
	const D = 1024
	for _, churn := range []int{0, 300_000} {
		b.Run(fmt.Sprint("after=", churn), func(b *testing.B) {
			cfg := ModelConfig{Hidden: D, Layers: 2}
			rc, err := RegionConfig(cfg, shm.Config{})
			require.NoError(b, err)
			r, err := shm.Create(rc)
			require.NoError(b, err)
			b.Cleanup(func() { r.Close() })
			e, err := Open(r, &cfg, Options{Logf: b.Logf})
			require.NoError(b, err)
			over := &Steering{Decode: Tier{Vectors: []Vector{{Hook: "post_block", Scale: 1, Data: randVec(rand.New(rand.NewPCG(1, 2)), D)}}}}
			cycle := func(id string) {
				if _, err := e.Admit(Admission{RequestID: id, Override: over}); err != nil {
					b.Fatal(err)
				}
				if _, err := e.End(id); err != nil {
					b.Fatal(err)
				}
			}
			for i := range churn {
				cycle(fmt.Sprint("churn-", i))
			}
			for i := 0; b.Loop(); i++ {
				cycle(fmt.Sprint("req-", i))
			}
		})
	}
}
