package steer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// checkMagnitudeExact is checkMagnitude without its fast path: the float64 composition of every
// site, then the clamps.
func checkMagnitudeExact(cfg ModelConfig, w *wire, named func(string) (wire, bool), set string) error {
	if err := checkTermsExact(cfg, w, named, set); err != nil {
		return err
	}
	return checkClamps(cfg, w, set)
}

// The magnitude check's fast path (a bound from the terms' norms) never accepts what the exact
// float64 composition refuses, and checkMagnitude gives the exact check's answer, message for
// message, on random sets whose terms range from tiny to beyond MaxMagnitude. Both ways are
// taken: the sample has sets the bound proves and sets it leaves to the exact check, some of
// those accepted and some refused.
func TestMagnitudeFastPathAgrees(t *testing.T) {
	cfg := smallCfg
	d := cfg.Hidden
	rng := rand.New(rand.NewPCG(43, 3))
	hooks := cfg.Hooks
	if len(hooks) == 0 {
		hooks = DefaultHooks
	}
	// A vector of components around 10^e (e drawn per vector), a few of them near the bound.
	vector := func() []float32 {
		e := []float64{-3, 0, 10, 27, 28, 29, 29.5, 30}[rng.IntN(8)]
		v := make([]float32, d)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * math.Pow(10, e) / 3)
		}
		return v
	}
	scale := func() float32 { return float32([]float64{1, 0.5, -2, 1e-3, 3}[rng.IntN(5)]) }
	site := func() (string, int) { return hooks[rng.IntN(2)], rng.IntN(cfg.Layers) } // few sites: terms pile up
	names := map[string]wire{}
	for i := range 4 {
		var s Steering
		for range 1 + rng.IntN(3) {
			h, l := site()
			s.Base.Vectors = append(s.Base.Vectors, Vector{Hook: h, Layer: l, Scale: scale(), Data: vector()})
		}
		w, err := resolveSteering(cfg, &s, nil, true)
		require.NoError(t, err)
		names[fmt.Sprint("n", i)] = w
	}
	named := func(n string) (wire, bool) { w, ok := names[n]; return w, ok }
	var proved, exactOK, exactRefused int
	for trial := range 3000 {
		var s Steering
		for _, p := range []Phase{PhaseBase, PhasePrefill, PhaseDecode} {
			tier := s.Tier(p)
			for range rng.IntN(3) {
				h, l := site()
				tier.Vectors = append(tier.Vectors, Vector{Hook: h, Layer: l, Scale: scale(), Data: vector()})
			}
			for range rng.IntN(2) {
				tier.Refs = append(tier.Refs, Ref{Name: fmt.Sprint("n", rng.IntN(5)), Strength: scale()}) // n4: not registered
			}
		}
		w, err := resolveSteering(cfg, &s, nil, true)
		require.NoError(t, err)
		set := fmt.Sprintf("trial %d", trial)
		exact := checkMagnitudeExact(cfg, &w, named, set)
		if magnitudeBounded(cfg, &w, named) {
			proved++
			require.NoError(t, exact, "the bound proved a set the exact check refuses")
		} else if exact == nil {
			exactOK++
		} else {
			exactRefused++
		}
		got := checkMagnitude(cfg, &w, named, set)
		if exact == nil {
			require.NoError(t, got, set)
		} else {
			require.EqualError(t, got, exact.Error(), set)
			require.ErrorIs(t, got, ErrOverflow)
		}
	}
	t.Logf("proved by the bound %d, left to the exact check: accepted %d, refused %d", proved, exactOK, exactRefused)
	require.Positive(t, proved)
	require.Positive(t, exactOK)
	require.Positive(t, exactRefused)
}

// A site read in place (one term at coefficient 1) is checked like a composed one: a named
// vector at scale 2^-40, referenced at strength 2^40 (coefficient exactly 1), re-registered with
// components of 1e35 (fine alone: 1e35 × 2^-40 ≈ 9e22) would add 1e35 to the request's rows, and
// Register refuses it, changing nothing.
func TestComposeChecksInPlaceSites(t *testing.T) {
	d := smallCfg.Hidden
	e := newOwner(t, smallCfg, Options{})
	small := float32(math.Ldexp(1, -40))
	_, err := e.Register("n", []Vector{{Hook: "mlp_in", Layer: 2, Scale: small, Data: filled(d, 1)}})
	require.NoError(t, err)
	s := Steering{Decode: Tier{Refs: []Ref{{Name: "n", Strength: float32(math.Ldexp(1, 40))}}}}
	_, err = e.Admit(Admission{RequestID: "r", Override: &s})
	require.NoError(t, err)
	v0 := e.Region().Version()
	_, err = e.Register("n", []Vector{{Hook: "mlp_in", Layer: 2, Scale: small, Data: filled(d, 1e35)}})
	require.ErrorIs(t, err, ErrOverflow)
	require.Contains(t, err.Error(), `request "r"`)
	require.Contains(t, err.Error(), "composed component 0")
	require.Equal(t, v0, e.Region().Version(), "nothing changed")
}

// allFinite (a SIMD norm for long slices) agrees with the element loop on every length 0-300,
// with a NaN, +Inf or -Inf at each kind of position, among values up to float32's largest.
func TestAllFiniteAgrees(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	loop := func(v []float32) bool {
		for _, f := range v {
			if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
				return false
			}
		}
		return true
	}
	bad := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))}
	for n := range 301 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32((2*rng.Float64() - 1) * []float64{1, 1e-30, math.MaxFloat32}[rng.IntN(3)])
		}
		require.Equal(t, loop(v), allFinite(v), "n %d, finite", n)
		require.True(t, allFinite(v), "n %d: values up to float32's largest are finite", n)
		for _, b := range bad {
			if n == 0 {
				continue
			}
			for _, at := range []int{0, n - 1, rng.IntN(n)} {
				w := append([]float32(nil), v...)
				w[at] = b
				require.Equal(t, loop(w), allFinite(w), "n %d, %g at %d", n, b, at)
				require.False(t, allFinite(w))
			}
		}
	}
}
