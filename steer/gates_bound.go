package steer

import (
	"fmt"
	"math"
)

// The gates' bound. A decode row of a request with gates gets, at a site, its own steering and
// every engaged gate add, all multiplied by the engaged attenuation (gateState.factor):
//
//	f × (request composition + Σ_add g_row × strength × scale × data),   g_row in [0, 1]
//
// where f is 1 or one attenuate gate's max(0, strength). Any subset of the gates may be engaged
// on any step, so checkGateBound bounds the worst case per component, in float64:
//
//	F × (|request composition| + Σ_add |strength × scale × data|) ≤ MaxMagnitude
//
// with F the largest of 1 and every attenuation factor. That keeps what a request adds through
// its steering and gates within MaxMagnitude, as its steering alone is without gates, on every
// path (the Stepper and the device path read the same stored gates). Without it a factor of 3e38
// on a 9e29 vector wrote +Inf, and 64 `always` adds of 9e29 each summed to 5.76e31.

// checkGateBound checks a request's stored gates (enc, an encodeGates value; nil: none) with its
// own steering w (as resolved, refs by name) against MaxMagnitude. It returns ErrOverflow
// naming the site, the component and the worst-case value.
func checkGateBound(cfg ModelConfig, w *wire, named func(string) (wire, bool), enc []byte, set string) error {
	if enc == nil {
		return nil
	}
	gates, err := decodeGateEntry(enc, cfg, false)
	if err != nil {
		return err
	}
	d := cfg.Hidden
	factor := 1.0
	sites := map[int][]float64{} // hook*layers + layer → worst-case |sum| per component
	acc := func(site int) []float64 {
		a := sites[site]
		if a == nil {
			a = make([]float64, d)
			sites[site] = a
		}
		return a
	}
	adds := map[int][]float64{} // Σ_add |…| per site
	for _, g := range gates {
		switch g.Apply {
		case ApplyAttenuate:
			factor = math.Max(factor, float64(g.Strength))
		case ApplyAdd:
			for _, v := range g.Steer {
				hook, _ := cfg.Hook(v.Hook)
				site := int(hook)*cfg.Layers + v.Layer
				if adds[site] == nil {
					adds[site] = make([]float64, d)
				}
				k := math.Abs(float64(g.Strength) * float64(v.Scale))
				for i, x := range v.Data {
					adds[site][i] += k * math.Abs(float64(x))
				}
			}
		}
	}
	// The request's decode composition (base and decode tiers), signed, per site.
	comp := func(p Phase, hook HookID, layer int, coef float64, data []float32) {
		if p == PhasePrefill {
			return // prefill rows are never gated
		}
		a := acc(int(hook)*cfg.Layers + layer)
		for i, x := range data {
			a[i] += coef * float64(x)
		}
	}
	for _, v := range w.vecs {
		comp(v.phase, v.hook, v.layer, float64(v.scale), v.data)
	}
	for _, r := range w.refs {
		if nw, ok := named(r.name); ok {
			for _, v := range nw.vecs {
				comp(r.phase, v.hook, v.layer, float64(r.strength)*float64(v.scale), v.data)
			}
		}
	}
	for site, a := range adds {
		s := acc(site)
		for i := range s {
			s[i] = math.Abs(s[i]) + a[i]
		}
	}
	for site, s := range sites {
		if adds[site] == nil {
			if factor <= 1 {
				continue // the request's steering alone, checked by checkMagnitude
			}
			for i := range s {
				s[i] = math.Abs(s[i])
			}
		}
		for i, x := range s {
			if v := factor * x; overBound(v) {
				return fmt.Errorf("%w: %s: its steering and gates can add %.4g at (%s, layer %d) component %d (adds summed, times the largest attenuate factor %g), beyond MaxMagnitude %g; lower the gates' strengths or the vectors",
					ErrOverflow, set, v, cfg.HookName(HookID(site/cfg.Layers)), site%cfg.Layers, i, factor, MaxMagnitude)
			}
		}
	}
	return nil
}

// checkAdmissionGates checks admission a's stored gates (enc) against the steering Admit would
// publish for it, read without touching the latches (so a refusal changes nothing).
func (e *Owner) checkAdmissionGates(a *Admission, digestOf func(string) (Digest, bool), named func(string) (wire, bool), enc []byte, set string) error {
	if enc == nil {
		return nil
	}
	var final Steering
	switch {
	case a.Override != nil && !a.Override.Empty():
		final = *a.Override
		if a.Override.Compose == ComposeAdd && !a.Conversation.zero() {
			if prev, ok := e.latches.peek(a.Conversation, digestOf); ok {
				final = mergeSteering(&prev, a.Override)
			}
		}
	case !a.Conversation.zero():
		final, _ = e.latches.peek(a.Conversation, digestOf)
	}
	w, err := resolveSteering(e.cfg, &final, digestOf, true)
	if err != nil {
		return nil // an invalid override: Admit refuses it with its own error
	}
	return checkGateBound(e.cfg, &w, named, enc, set)
}
