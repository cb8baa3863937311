package steer

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/shm"
)

var smallCfg = ModelConfig{Hidden: 40, Layers: 3}

func newOwner(t testing.TB, cfg ModelConfig, opt Options) *Owner {
	t.Helper()
	rc, err := RegionConfig(cfg, shm.Config{IndexSlots: 1 << 12, ArenaBytes: 32 << 20, ReaderSlots: 64})
	require.NoError(t, err)
	r, err := shm.Create(rc)
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	if opt.Logf == nil {
		opt.Logf = t.Logf
	}
	e, err := Open(r, &cfg, opt)
	require.NoError(t, err)
	return e
}

// newReader opens the owner's region again as a reader (as a worker would after attach).
func newReader(t testing.TB, owner *Owner, opt Options) *Worker {
	t.Helper()
	r, err := shm.Open(owner.Region().Files())
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	e, err := Attach(r, nil, opt)
	require.NoError(t, err)
	return e
}

func randVec(rng *rand.Rand, d int) []float32 {
	v := make([]float32, d)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

func unitVec(rng *rand.Rand, d int) []float32 {
	v := randVec(rng, d)
	var ss float64
	for _, f := range v {
		ss += float64(f) * float64(f)
	}
	for i := range v {
		v[i] = float32(float64(v[i]) / math.Sqrt(ss))
	}
	return v
}

// refModel is the plain reference computation of the steering model, in float64.
type refModel struct {
	cfg    ModelConfig
	named  map[string][]Vector
	global Steering
	reqs   map[string]Steering
}

// apply computes what Stepper.Apply must produce for one (hook, layer).
func (m *refModel) apply(hook string, layer int, h []float32, batch []Span) []float64 {
	d := m.cfg.Hidden
	out := make([]float64, len(h))
	for i, f := range h {
		out[i] = float64(f)
	}
	for _, sp := range batch {
		eff := make([]float64, d)
		var clamps []Clamp
		req := m.reqs[sp.ID]
		for _, s := range []*Steering{&m.global, &req} {
			for _, t := range []*Tier{&s.Base, s.Tier(sp.Phase)} {
				for _, v := range t.Vectors {
					if v.Hook == hook && v.Layer == layer {
						for i := range eff {
							eff[i] += float64(v.Scale) * float64(v.Data[i])
						}
					}
				}
				for _, r := range t.Refs {
					for _, v := range m.named[r.Name] {
						if v.Hook == hook && v.Layer == layer {
							for i := range eff {
								eff[i] += float64(r.Strength) * float64(v.Scale) * float64(v.Data[i])
							}
						}
					}
				}
			}
		}
		// Clamps run after the add: global ones first, then the request's, each tier in order.
		for _, s := range []*Steering{&m.global, &req} {
			for _, t := range []*Tier{&s.Base, s.Tier(sp.Phase)} {
				for _, c := range t.Clamps {
					if c.Hook == hook && c.Layer == layer {
						clamps = append(clamps, c)
					}
				}
			}
		}
		for r := sp.Start; r < sp.End; r++ {
			row := out[r*d : (r+1)*d]
			for i := range row {
				row[i] += eff[i]
			}
			for _, c := range clamps {
				var ss, p float64
				for _, f := range c.Dir {
					ss += float64(f) * float64(f)
				}
				n := math.Sqrt(ss)
				for i := range row {
					p += row[i] * float64(c.Dir[i]) / n
				}
				q := math.Min(math.Max(p, float64(c.Min)), float64(c.Max))
				for i := range row {
					row[i] += float64(c.Strength) * (q - p) * float64(c.Dir[i]) / n
				}
			}
		}
	}
	return out
}

func requireClose(t testing.TB, want []float64, got []float32, what string) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		tol := 1e-4 * (1 + math.Abs(want[i]))
		if math.Abs(float64(got[i])-want[i]) > tol {
			require.Failf(t, "mismatch", "%s: element %d: got %g want %g", what, i, got[i], want[i])
		}
	}
}
