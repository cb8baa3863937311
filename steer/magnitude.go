package steer

import (
	"fmt"
	"math"

	"github.com/shmsteer/shmsteer/kernels"
	"github.com/shmsteer/shmsteer/shm"
)

// MaxMagnitude bounds every number steering adds to a hidden state, so that nothing finite the
// user hands in can turn into ±Inf or NaN in a hidden state:
//
//   - every coefficient: a vector's Scale, and Strength×Scale for each entry of a referenced
//     named vector;
//   - every term: coefficient × data component;
//   - every composed component: for each (hook, layer, phase), the sum of a steering set's terms
//     that apply there (its base tier plus its prefill or decode tier), computed separately for
//     the global steering and for a request's own steering;
//   - a clamp's Min and Max; its Strength must be in [0, 1] (else ErrBadClamp);
//   - what a request adds through its gates: its decode steering and every gate add, summed
//     in absolute value per component and times its largest attenuate factor (checkGateBound,
//     gates_bound.go).
//
// The clamp rule is what keeps the composed result (a row after every vector and every clamp,
// global ones first) within the bound: a clamp of direction u (unit), bounds [lo, hi] and
// strength s moves the row's projection p = row·u to p + s·(min(max(p, lo), hi) − p), which
// for s in [0, 1] lies between p and [lo, hi], so |p'| ≤ max(|p|, |lo|, |hi|) and no component
// orthogonal to u changes. A strength above 1 overshoots (9e29 against a projection of 9e29
// wrote −Inf); a negative one pushes away. The same rule holds on every path (Go, RPC, C,
// HTTP) because the owner checks it here, on the set as resolved, for every write.
//
// Register, SetGlobal and Admit check this in float64 and refuse input beyond the bound with
// ErrOverflow, changing nothing. A composition that would only exceed it later (a named vector
// re-registered with larger values under a reference) is refused where it happens: the owner
// recomposes every set that references the vector in the same transaction, so Register fails
// with ErrOverflow naming the set and changes nothing. The owner composes in float32, so it
// allows stepperMargin×MaxMagnitude to keep float32 rounding from refusing what was admitted.
// The vectors a step adds to a row (global plus request composition) thus stay within
// 2×stepperMargin×MaxMagnitude, far below the float32 maximum of 3.4e38: every sum is finite.
const MaxMagnitude = 1e30

// stepperMargin is the Stepper's allowance over MaxMagnitude for float32 rounding in its
// composition (it sums a site's terms in float32; the write-time check sums in float64).
const stepperMargin = 2

// magnitudeError builds the ErrOverflow message: where (tier and site), what and the value.
func magnitudeError(set string, phase Phase, cfg ModelConfig, hook HookID, layer int, what string, value float64) error {
	return fmt.Errorf("%w: %s, %s tier at (%s, layer %d): %s = %.4g exceeds MaxMagnitude %g",
		ErrOverflow, set, phase, cfg.HookName(hook), layer, what, value, MaxMagnitude)
}

// overBound reports whether x is outside [-MaxMagnitude, MaxMagnitude] (NaN included).
func overBound(x float64) bool { return !(math.Abs(x) <= MaxMagnitude) }

// checkMagnitude checks w (as resolved: refs by name) against MaxMagnitude, composing in float64
// the way the Stepper composes in float32. named returns the named vector a ref uses (ok false:
// not registered, contributes nothing). set names the steering set in messages ("global
// steering", "request \"r1\"", "named vector \"x\"").
//
// A set whose bound (magnitudeBounded) is within half of MaxMagnitude passes without the exact
// float64 composition: that is every set steering real models (it costs one SIMD norm per term);
// any other is checked exactly, so the errors are the same either way.
func checkMagnitude(cfg ModelConfig, w *wire, named func(string) (wire, bool), set string) error {
	if !magnitudeBounded(cfg, w, named) {
		if err := checkTermsExact(cfg, w, named, set); err != nil {
			return err
		}
	}
	return checkClamps(cfg, w, set)
}

// magnitudeBounded reports whether every coefficient, term and composed component of w is
// provably within MaxMagnitude/2, hence within MaxMagnitude, without composing: per site and
// phase it sums |coefficient| × ‖data‖₂ (kernels.Norm, which bounds every |component| from
// above) over the terms that apply there. The factor 2 leaves room, many times over, for the
// float64 rounding of the bound itself. false means only "not proven": checkTermsExact decides.
func magnitudeBounded(cfg ModelConfig, w *wire, named func(string) (wire, bool)) bool {
	const limit = MaxMagnitude / 2
	if len(w.vecs) == 0 && len(w.refs) == 0 {
		return true
	}
	bound := make([]float64, cfg.NumHooks()*cfg.Layers*2) // per site and phase, as compose's
	add := func(p Phase, hook HookID, layer int, coef float64, data []float32) bool {
		coef = math.Abs(coef)
		t := coef * kernels.Norm(data)
		if !(coef <= limit) || !(t <= limit) {
			return false
		}
		ix := (int(hook)*cfg.Layers + layer) * 2
		if p != PhaseDecode {
			bound[ix] += t
		}
		if p != PhasePrefill {
			bound[ix+1] += t
		}
		return true
	}
	for _, v := range w.vecs {
		if !add(v.phase, v.hook, v.layer, float64(v.scale), v.data) {
			return false
		}
	}
	if len(w.refs) > 0 && named == nil {
		return false
	}
	for _, r := range w.refs {
		nw, ok := named(r.name)
		if !ok {
			continue
		}
		for _, v := range nw.vecs {
			if !add(r.phase, v.hook, v.layer, float64(r.strength)*float64(v.scale), v.data) {
				return false
			}
		}
	}
	for _, b := range bound {
		if !(b <= limit) {
			return false
		}
	}
	return true
}

// checkTermsExact checks w's coefficients, terms and composed components against MaxMagnitude
// exactly, composing in float64 (checkMagnitude's slow path).
func checkTermsExact(cfg ModelConfig, w *wire, named func(string) (wire, bool), set string) error {
	d := cfg.Hidden
	// sums holds the composition of each site-phase touched, ix = ((hook*layers)+layer)*2 + phase-1.
	sums := map[int][]float64{}
	add := func(p Phase, hook HookID, layer int, coef float64, data []float32) {
		for _, q := range []Phase{PhasePrefill, PhaseDecode} {
			if p != PhaseBase && p != q {
				continue
			}
			ix := (int(hook)*cfg.Layers+layer)*2 + int(q) - 1
			acc := sums[ix]
			if acc == nil {
				acc = make([]float64, d)
				sums[ix] = acc
			}
			for i, f := range data {
				acc[i] += coef * float64(f)
			}
		}
	}
	term := func(p Phase, hook HookID, layer int, coef float64, what string, data []float32) error {
		if overBound(coef) {
			return magnitudeError(set, p, cfg, hook, layer, what+" coefficient", coef)
		}
		for i, f := range data {
			if x := coef * float64(f); overBound(x) {
				return magnitudeError(set, p, cfg, hook, layer, fmt.Sprintf("%s × data[%d]", what, i), x)
			}
		}
		add(p, hook, layer, coef, data)
		return nil
	}
	for i, v := range w.vecs {
		if err := term(v.phase, v.hook, v.layer, float64(v.scale), fmt.Sprintf("vector %d scale", i), v.data); err != nil {
			return err
		}
	}
	for i, r := range w.refs {
		nw, ok := named(r.name)
		if !ok {
			continue
		}
		for j, v := range nw.vecs {
			what := fmt.Sprintf("ref %d (%q entry %d) strength × scale", i, r.name, j)
			if err := term(r.phase, v.hook, v.layer, float64(r.strength)*float64(v.scale), what, v.data); err != nil {
				return err
			}
		}
	}
	for ix, acc := range sums {
		for i, x := range acc {
			if overBound(x) {
				site := ix / 2
				return magnitudeError(set, Phase(ix%2+1), cfg, HookID(site/cfg.Layers), site%cfg.Layers,
					fmt.Sprintf("composed component %d (base + phase tiers)", i), x)
			}
		}
	}
	return nil
}

// checkClamps checks w's clamp bounds against MaxMagnitude and their strengths (in [0, 1]).
func checkClamps(cfg ModelConfig, w *wire, set string) error {
	for i, c := range w.clamps {
		bound := math.Max(math.Abs(float64(c.lo)), math.Abs(float64(c.hi)))
		if overBound(bound) {
			return magnitudeError(set, c.phase, cfg, c.hook, c.layer, fmt.Sprintf("clamp %d bound", i), bound)
		}
		if !(c.str >= 0 && c.str <= 1) {
			return fmt.Errorf("%w: %s, %s tier at (%s, layer %d): clamp %d strength %g not in [0, 1] (a clamp moves a projection toward [min, max], never past it)",
				ErrBadClamp, set, c.phase, cfg.HookName(c.hook), c.layer, i, c.str)
		}
	}
	return nil
}

// namedAt decodes named vectors from snapshot s, for checkMagnitude.
func namedAt(s *shm.Snapshot, cfg ModelConfig) func(string) (wire, bool) {
	return func(name string) (wire, bool) {
		b, _, err := s.View(KindVector, name)
		if err != nil {
			return wire{}, false
		}
		w, err := decode(b, cfg, false)
		return w, err == nil
	}
}
