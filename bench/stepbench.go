package bench

import (
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/shmsteer/shmsteer/kernels"
	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
)

// The prefill step figures (steer.step.prefill.*): one (hook, layer) of a batch of T=256 rows
// of D=4096 owned by 16 requests with distinct steering (inline vectors, named references, phase
// tiers) on top of global steering, against the bare gather-add kernel over the same rows.
// The decode figures are in decodebench.go.
const stepT, stepD, stepRequests = 256, 4096, 16

type stepFixture struct {
	region *shm.Region
	engine *steer.Owner
	batch  []steer.Span
	h      []float32
}

func newStepFixture() (*stepFixture, error) {
	cfg := steer.ModelConfig{Hidden: stepD, Layers: 4}
	rc, err := steer.RegionConfig(cfg, shm.Config{IndexSlots: 1 << 12, ArenaBytes: 32 << 20})
	if err != nil {
		return nil, err
	}
	r, err := shm.Create(rc)
	if err != nil {
		return nil, err
	}
	f := &stepFixture{region: r}
	if err := f.fill(cfg); err != nil {
		r.Close()
		return nil, err
	}
	return f, nil
}

func randVec(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = 2*rng.Float32() - 1
	}
	return v
}

func (f *stepFixture) fill(cfg steer.ModelConfig) (err error) {
	if f.engine, err = steer.Open(f.region, &cfg, steer.Options{}); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	vec := func(scale float32) []steer.Vector {
		return []steer.Vector{{Hook: "pre_attn", Layer: 0, Scale: scale, Data: randVec(rng, stepD)}}
	}
	for i := range 4 {
		if _, err := f.engine.Register(fmt.Sprint("n", i), vec(1)); err != nil {
			return err
		}
	}
	if _, err := f.engine.SetGlobal(steer.Steering{Base: steer.Tier{Vectors: vec(0.1)}}); err != nil {
		return err
	}
	for i := range stepRequests {
		id := fmt.Sprint("request-", i)
		var s steer.Steering
		switch i % 4 {
		case 0:
			s.Base.Vectors = vec(float32(i))
		case 1:
			s.Decode.Refs = []steer.Ref{{Name: fmt.Sprint("n", i%4), Strength: float32(i)}, {Name: "n0", Strength: 1}}
		case 2:
			s.Base.Vectors = vec(1)
			s.Prefill.Refs = []steer.Ref{{Name: "n2", Strength: 0.5}}
		case 3:
			s.Prefill.Vectors = vec(2)
			s.Decode.Refs = []steer.Ref{{Name: "n3", Strength: -1}}
		}
		if _, err := f.engine.Admit(steer.Admission{RequestID: id, Override: &s}); err != nil {
			return err
		}
		f.batch = append(f.batch, steer.Span{ID: id, Start: i * stepT / stepRequests, End: (i + 1) * stepT / stepRequests, Phase: steer.Phase(1 + i%2)})
	}
	f.h = prefillH.get(func() []float32 { return randVec(rng, stepT*stepD) })
	return nil
}

// sharedH is the hidden state both contenders of a step figure add into, made on first use:
// the step and its kernel read and write the same pages, so where this process's h lies (its
// physical pages, the cache sets they map to) weighs on both alike, as the add kernels share
// their h (kernelBuffers).
type sharedH struct {
	mu sync.Mutex
	h  []float32
}

// get returns the shared h, made by mk the first time.
func (s *sharedH) get(mk func() []float32) []float32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.h == nil {
		s.h = mk()
	}
	return s.h
}

// prefillH is the prefill pair's h (stepT rows), decodeH the decode figures' (decodeRequests
// rows: the dense and sparse pairs and the scattered diagnostic).
var prefillH, decodeH sharedH

// stepMixed is steer.step.prefill.mixed_ns: pin a snapshot, check the 16 requests' cached
// compositions, one fused add per request's rows, unpin.
func stepMixed() (Op, func() error, error) {
	f, err := newStepFixture()
	if err != nil {
		return nil, nil, err
	}
	st := f.engine.NewStepper()
	step := func() error {
		if err := st.Begin(0); err != nil {
			return err
		}
		defer st.End()
		return st.Apply(0, 0, f.h, f.batch)
	}
	if err := step(); err != nil { // compose once: the figure is the steady state
		return nil, nil, err
	}
	op := cpuOp(func(n int) error {
		for range n {
			if err := step(); err != nil {
				return err
			}
		}
		return nil
	})
	return op, func() error { st.Close(); return f.region.Close() }, nil
}

// stepKernel is steer.step.prefill.kernel_ns: the bare gather-add of one vector per request over the
// same rows (of the same h: prefillH).
func stepKernel() (Op, func() error, error) {
	rng := rand.New(rand.NewPCG(3, 4))
	h0, table := randVec(rng, stepT*stepD), randVec(rng, (stepRequests+1)*stepD)
	h := prefillH.get(func() []float32 { return h0 })
	idx := make([]int32, stepT)
	for t := range idx {
		idx[t] = int32(1 + t*stepRequests/stepT)
	}
	return cpuOp(func(n int) error {
		for range n {
			kernels.GatherAdd(h, stepD, table, idx)
		}
		return nil
	}), nil, nil
}
