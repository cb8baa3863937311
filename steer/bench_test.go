package steer

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/shmsteer/shmsteer/kernels"
)

// BenchmarkStep compares a full step apply (pin a snapshot, validate 16 requests' cached
// compositions, one fused add per request row range, unpin) with the bare gather-add kernel
// over the same rows. Run:
//
//	go test -run '^$' -bench BenchmarkStep -benchmem -count 5 ./steer/
func BenchmarkStep(b *testing.B) {
	const T, D, R = 256, 4096, 16
	cfg := ModelConfig{Hidden: D, Layers: 4}
	e := newOwner(b, cfg, Options{})
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 4 {
		if _, err := e.Register(fmt.Sprint("n", i), []Vector{{Hook: "pre_attn", Layer: 0, Scale: 1, Data: randVec(rng, D)}}); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := e.SetGlobal(Steering{Base: Tier{Vectors: []Vector{{Hook: "pre_attn", Layer: 0, Scale: 0.1, Data: randVec(rng, D)}}}}); err != nil {
		b.Fatal(err)
	}
	batch := make([]Span, R)
	for i := range R {
		id := fmt.Sprint("request-", i)
		var s Steering
		switch i % 4 { // distinct steering per request: inline, refs, both, phase tiers
		case 0:
			s.Base.Vectors = []Vector{{Hook: "pre_attn", Layer: 0, Scale: float32(i), Data: randVec(rng, D)}}
		case 1:
			s.Decode.Refs = []Ref{{Name: fmt.Sprint("n", i%4), Strength: float32(i)}, {Name: "n0", Strength: 1}}
		case 2:
			s.Base.Vectors = []Vector{{Hook: "pre_attn", Layer: 0, Scale: 1, Data: randVec(rng, D)}}
			s.Prefill.Refs = []Ref{{Name: "n2", Strength: 0.5}}
		case 3:
			s.Prefill.Vectors = []Vector{{Hook: "pre_attn", Layer: 0, Scale: 2, Data: randVec(rng, D)}}
			s.Decode.Refs = []Ref{{Name: "n3", Strength: -1}}
		}
		if _, err := e.Admit(Admission{RequestID: id, Override: &s}); err != nil {
			b.Fatal(err)
		}
		batch[i] = Span{ID: id, Start: i * T / R, End: (i + 1) * T / R, Phase: Phase(1 + i%2)}
	}
	h := randVec(rng, T*D)

	b.Run("mixed", func(b *testing.B) {
		st := e.NewStepper()
		defer st.Close()
		// Compose every request once before timing: the loop measures the steady state.
		if err := st.Begin(0); err != nil || st.Apply(0, 0, h, batch) != nil {
			b.Fatal("warm-up failed")
		}
		st.End()
		b.SetBytes(int64(T * D * 4))
		b.ReportAllocs()
		for b.Loop() {
			if err := st.Begin(0); err != nil {
				b.Fatal(err)
			}
			if err := st.Apply(0, 0, h, batch); err != nil {
				b.Fatal(err)
			}
			st.End()
		}
	})
	b.Run("kernel", func(b *testing.B) {
		table := randVec(rng, (R+1)*D)
		idx := make([]int32, T)
		for t := range idx {
			idx[t] = int32(1 + t*R/T)
		}
		b.SetBytes(int64(T * D * 4))
		b.ReportAllocs()
		for b.Loop() {
			kernels.GatherAdd(h, D, table, idx)
		}
	})
}
