package steer

import (
	"fmt"
	"testing"

	"github.com/shmsteer/shmsteer/kernels"
	"github.com/shmsteer/shmsteer/shm"
)

// The decode shape: 32 layers × 5 hooks, D = 4096, 64 requests of one row each, every request
// with distinct steering at every site (or only 4 of them steered: sparse), with or without a
// global vector at every site. "kernel" is the bare add of the same composed vectors (read in
// place) to the same rows, one kernels.AddRows per steered row: what the step cannot go below.
func benchDecode(b *testing.B, steered int, global bool, mode string) {
	const d, layers, reqs = 4096, 32, 64
	cfg := ModelConfig{Hidden: d, Layers: layers}
	rc, err := RegionConfig(cfg, shm.Config{IndexSlots: 1 << 12, ArenaBytes: 448 << 20})
	if err != nil {
		b.Fatal(err)
	}
	r, err := shm.Create(rc)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	e, err := Open(r, nil, Options{})
	if err != nil {
		b.Fatal(err)
	}
	hooks := cfg.NumHooks()
	vec := func(seed int) []float32 { return benchVec(d, seed) }
	if global {
		var g Steering
		for hk := 0; hk < hooks; hk++ {
			for l := 0; l < layers; l++ {
				g.Decode.Vectors = append(g.Decode.Vectors, Vector{Hook: cfg.HookName(HookID(hk)), Layer: l, Scale: 0.5, Data: vec(hk*layers + l)})
			}
		}
		if _, err := e.SetGlobal(g); err != nil {
			b.Fatal(err)
		}
	}
	batch := admitDecodeBatch(b, e, cfg, reqs, steered)
	h := make([]float32, reqs*d)
	st := e.NewStepper()
	defer st.Close()
	step := func() {
		if err := st.Begin(0); err != nil {
			b.Fatal(err)
		}
		for hk := 0; hk < hooks; hk++ {
			for l := 0; l < layers; l++ {
				if err := st.Apply(HookID(hk), l, h, batch); err != nil {
					b.Fatal(err)
				}
			}
		}
		st.End()
	}
	step()
	// The kernel: the same composed vectors, viewed in place, added row by row.
	snap, err := r.Snapshot()
	if err != nil {
		b.Fatal(err)
	}
	defer snap.Close()
	type add struct {
		row int
		v   []float32
	}
	var adds [][]add
	for ix := 0; ix < hooks*layers*2; ix += 2 {
		var site []add
		for i := range batch {
			cv, err := openComposed(&snap, cfg, e.pool, KindComposed, batch[i].ID, KindRequest)
			if err != nil {
				b.Fatal(err)
			}
			if v, _, _ := cv.at(ix + 1); v != nil {
				site = append(site, add{i, v})
			}
		}
		adds = append(adds, site)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		if mode == "mixed" {
			step()
			continue
		}
		for _, site := range adds {
			for _, a := range site {
				kernels.AddRows(h[a.row*d:(a.row+1)*d], d, 1, a.v)
			}
		}
	}
}

// benchVec is a deterministic vector of d floats in [0, 1) for seed.
func benchVec(d, seed int) []float32 {
	v := make([]float32, d)
	for i := range v {
		v[i] = float32((seed*31+i)%97) / 97
	}
	return v
}

// admitDecodeBatch admits reqs one-row decode requests, the first steered of them with a vector
// at every site, and returns their batch.
func admitDecodeBatch(b *testing.B, e *Owner, cfg ModelConfig, reqs, steered int) []Span {
	batch := make([]Span, reqs)
	hooks, layers := cfg.NumHooks(), cfg.Layers
	for i := range batch {
		id := fmt.Sprintf("req-%02d", i)
		batch[i] = Span{ID: id, Start: i, End: i + 1, Phase: PhaseDecode}
		a := Admission{RequestID: id}
		if i < steered {
			var s Steering
			for hk := 0; hk < hooks; hk++ {
				for l := 0; l < layers; l++ {
					s.Decode.Vectors = append(s.Decode.Vectors, Vector{Hook: cfg.HookName(HookID(hk)), Layer: l, Scale: 1, Data: benchVec(cfg.Hidden, 1000+i*hooks*layers+hk*layers+l)})
				}
			}
			a.Override = &s
		}
		if _, err := e.Admit(a); err != nil {
			b.Fatal(err)
		}
	}
	return batch
}

func BenchmarkDecodeDense(b *testing.B) {
	for _, global := range []bool{false, true} {
		for _, mode := range []string{"kernel", "mixed"} {
			b.Run(fmt.Sprintf("global=%v/%s", global, mode), func(b *testing.B) { benchDecode(b, 64, global, mode) })
		}
	}
}

func BenchmarkDecodeSparse(b *testing.B) {
	for _, mode := range []string{"kernel", "mixed"} {
		b.Run(mode, func(b *testing.B) { benchDecode(b, 4, false, mode) })
	}
}
