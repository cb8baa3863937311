package steer

import (
	"errors"
	"fmt"
	"math"

	"github.com/shmsteer/shmsteer/kernels"
	"github.com/shmsteer/shmsteer/shm"
)

// Gates at the step (the Go Stepper). Only decode rows are gated: prefill rows get neither a
// probe read, a gated add nor an attenuation (prefill steering feeds prefix-cache keys, as in
// the fork).
//
//   - A probe is read at its (hook, layer) site, before that site's steering is added: per row
//     g = sigmoid(sharpness·(h·probe − threshold)), the dot product in float64 in row order,
//     so every rank computes the same g from the same residual.
//   - this_token: the add applies at the sites applied after the probe was read in this step
//     (its own site included), each decode row weighted by its g; sites applied before it get
//     nothing from the gate (the fork adds at full strength there). With when=always the add
//     applies to every decode row at every site.
//   - next_step, rest_of_request, rest_of_conversation are evaluated on the host: the gate fires
//     at a step when sigmoid(sharpness·(mean of the request's row scores − threshold)) > 0.5
//     (always: at every step the request has decode rows). End advances them: next_step applies
//     during the request's next decode step only (a one-step pulse), the rest_of_ scopes from
//     its next decode step until it ends; rest_of_conversation also on the conversation's later
//     requests (gates_conv.go).
//   - attenuate multiplies the request's own steering (not the global steering or clamps) and
//     the gates' adds by max(0, strength) while engaged (this_token: only with when=always).
//
// The engaged state is per request and per Stepper; it is reset when the request is admitted
// again (its gate entry changes). Every decision is folded into the step's Checksum.

// gateState is a request's gates as one Stepper reads and advances them.
type gateState struct {
	ver    uint64
	conv   uint64 // the request's conversation hash (0: none)
	idHash uint64 // the request id's hash (the gate decisions' checksum)
	gates  []AdmittedGate
	g      []gateRun
	// decodeStep is the Stepper step in which the request last had decode rows.
	decodeStep uint64
}

type gateRun struct {
	probeSite int // hook*layers + layer; -1 without a probe
	adds      []gateAdd
	rowG      []float32 // this_token: the rows' gates of this step, by row of the batch
	evalStep  uint64    // step the probe was last read in
	fired     bool      // host scopes: fired in this step
	pulse     bool      // next_step: applies in this step
	sticky    bool      // rest_of_*: applies until the request ends
	convKey   uint64    // rest_of_conversation in a conversation: its key in convEngaged
}

type gateAdd struct {
	site  int
	scale float32
	data  []float32
}

// readGates reads request st's gate entry at this step's version (decoding it only when its
// version changed).
func (s *Stepper) readGates(st *reqState) error {
	b, ver, err := s.snap.View(KindGates, st.id)
	if errors.Is(err, shm.ErrNotFound) {
		st.gates = nil
		return nil
	} else if err != nil {
		return fmt.Errorf("request %q gates: %w", st.id, err)
	}
	if st.gates != nil && st.gates.ver == ver {
		return nil
	}
	gates, err := decodeGateEntry(b, s.e.cfg, false)
	if err != nil {
		return fmt.Errorf("request %q: %w", st.id, err)
	}
	gs := &gateState{ver: ver, conv: gateConvOf(b), idHash: st.idHash, gates: gates, g: make([]gateRun, len(gates))}
	cfg := s.e.cfg
	site := func(hook string, layer int) int {
		id, _ := cfg.Hook(hook) // the owner checked it
		return int(id)*s.layers + layer
	}
	for i := range gates {
		r := &gs.g[i]
		r.probeSite = -1
		if gates[i].When == WhenProbe {
			r.probeSite = site(gates[i].Probe.Hook, gates[i].Probe.Layer)
		}
		for _, v := range gates[i].Steer {
			r.adds = append(r.adds, gateAdd{site: site(v.Hook, v.Layer), scale: v.Scale, data: v.Data})
		}
		if g := &gates[i]; g.Scope == ScopeRestOfConversation && gs.conv != 0 {
			r.convKey = gateConvKey(gs.conv, g.ProbeDigest, g.SteerDigest, g.When, g.Apply)
			r.sticky = s.convEngaged[r.convKey] || g.Engaged
		}
	}
	st.gates = gs
	return nil
}

// dot is h·p in float64, in index order (the same result on every rank and path).
func dot(h, p []float32) float64 {
	var s float64
	for i, x := range h {
		s += float64(x) * float64(p[i])
	}
	return s
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// gatesBefore runs a decode span's gates at site before its steering is added: it notes the
// request's decode step, reads the probes at this site and returns the attenuation factor.
// blk is the span's rows, from row start of the batch: a this_token gate keeps each row's
// value by its row in the batch, so a request with several spans in one step (multi-token
// decode) gates each of its rows by its own probe read, as the device path does.
func (s *Stepper) gatesBefore(gs *gateState, site int, blk []float32, start int) float32 {
	d := s.d
	rows := len(blk) / d
	if gs.decodeStep != s.step {
		gs.decodeStep = s.step
		s.gated = append(s.gated, gs)
		for i := range gs.g {
			if gs.gates[i].When == WhenAlways && gs.gates[i].Scope != ScopeThisToken {
				gs.g[i].fired = true
			}
		}
	}
	for i := range gs.g {
		r, g := &gs.g[i], &gs.gates[i]
		if r.probeSite != site {
			continue
		}
		r.evalStep = s.step
		s.countEval(g.Scope)
		scale := float64(g.Probe.Scale)
		if g.Scope == ScopeThisToken {
			if n := start + rows; n > len(r.rowG) {
				if n > cap(r.rowG) {
					r.rowG = append(make([]float32, 0, n), r.rowG...)
				}
				r.rowG = r.rowG[:n]
			}
			for t := range rows {
				v := sigmoid(float64(g.Sharpness) * (scale*dot(blk[t*d:(t+1)*d], g.Probe.Data) - float64(g.Threshold)))
				r.rowG[start+t] = float32(v)
				s.rowDecision(gs, i, t, v > 0.5)
				s.sum = mix64(s.sum, uint64(math.Float32bits(r.rowG[start+t])))
			}
			continue
		}
		var sum float64
		for t := range rows {
			sum += scale * dot(blk[t*d:(t+1)*d], g.Probe.Data)
		}
		s.hostDecision(gs, i, rows > 0 && sigmoid(float64(g.Sharpness)*(sum/float64(rows)-float64(g.Threshold))) > 0.5)
	}
	return gs.factor()
}

// factor is the request's attenuation in this step: the last engaged attenuate gate's
// max(0, strength), else 1. Every engaged gate is known when the step begins (attenuate with
// a this_token probe is refused), so the device path folds it into the request's table rows.
func (gs *gateState) factor() float32 {
	f := float32(1)
	for i := range gs.g {
		g := &gs.gates[i]
		if g.Apply == ApplyAttenuate && gs.g[i].engaged(g) {
			f = max(0, g.Strength)
		}
	}
	return f
}

func (s *Stepper) countEval(scope GateScope) {
	s.stats.GateEvaluations++
	s.stats.GateScopes[scope].Evaluations++
}

// rowDecision records a this_token probe's decision for row t of the request's span.
func (s *Stepper) rowDecision(gs *gateState, i, t int, fired bool) {
	d := uint64(1)
	if fired {
		s.stats.GateFires++
		s.stats.GateScopes[ScopeThisToken].Fires++
		d = 2
	}
	s.gsum += mix64(mix64(gs.idHash, uint64(i)<<32|uint64(t)), d)
}

// hostDecision records a host-evaluated probe gate's decision for the step.
func (s *Stepper) hostDecision(gs *gateState, i int, fired bool) {
	if fired {
		gs.g[i].fired = true
		s.stats.GateFires++
		s.stats.GateScopes[gs.gates[i].Scope].Fires++
	}
}

// engaged reports whether a gate other than a this_token probe gate applies in this step.
func (r *gateRun) engaged(g *AdmittedGate) bool {
	switch g.Scope {
	case ScopeThisToken:
		return g.When == WhenAlways
	case ScopeNextStep:
		return r.pulse
	}
	return r.sticky
}

// gatesAdd adds a decode span's engaged gate adds at site, after its steering; blk is the
// span's rows, from row start of the batch.
func (s *Stepper) gatesAdd(gs *gateState, site int, blk []float32, start int, f float32) {
	d := s.d
	for i := range gs.g {
		r, g := &gs.g[i], &gs.gates[i]
		if g.Apply != ApplyAdd {
			continue
		}
		perRow := g.Scope == ScopeThisToken && g.When == WhenProbe
		if perRow && r.evalStep != s.step || !perRow && !r.engaged(g) {
			continue
		}
		for _, a := range r.adds {
			if a.site != site {
				continue
			}
			k := f * g.Strength * a.scale
			if !perRow {
				kernels.AddRows(blk, d, k, a.data)
				s.sum = mix64(s.sum, uint64(i)<<32|uint64(math.Float32bits(k)))
				continue
			}
			for t := range min(len(blk)/d, len(r.rowG)-start) {
				if w := r.rowG[start+t]; w != 0 {
					kernels.AddRows(blk[t*d:(t+1)*d], d, k*w, a.data)
				}
			}
			s.sum = mix64(s.sum, uint64(i)<<32|uint64(math.Float32bits(k)))
		}
	}
}

// advanceGates moves the host-evaluated scopes of the requests decoded in this step on to the
// next (End).
func (s *Stepper) advanceGates() {
	for _, gs := range s.gated {
		s.advance(gs)
	}
	clear(s.gated)
	s.gated = s.gated[:0]
}

// advance moves one request's host-evaluated scopes on to its next decode step.
func (s *Stepper) advance(gs *gateState) {
	for i := range gs.g {
		r := &gs.g[i]
		sc := gs.gates[i].Scope
		switch sc {
		case ScopeNextStep:
			r.pulse = r.fired
			if r.pulse {
				s.stats.GateScopes[sc].Engaged++
			}
		case ScopeRestOfRequest, ScopeRestOfConversation:
			if r.fired && !r.sticky {
				s.stats.GateScopes[sc].Engaged++
				if r.convKey != 0 {
					s.engageConv(r.convKey)
				}
			}
			r.sticky = r.sticky || r.fired
		}
		if r.fired {
			s.sum = mix64(s.sum, uint64(i)+1)
		}
		if sc != ScopeThisToken {
			d := uint64(1)
			if r.fired {
				d = 2
			}
			s.gsum += mix64(mix64(gs.idHash, uint64(i)<<32|0xFFFFFFFF), d)
		}
		r.fired = false
	}
}

// GateChecksum is the checksum of the gate decisions of the current (or last) step: per
// request, which rows' this_token probes fired and which host-evaluated gates fired. It is a
// sum, so the order the sites ran in does not count, and it is the same for a native step
// (after End) and a device-path step (after Batch.Report) that made the same decisions.
func (s *Stepper) GateChecksum() uint64 { return s.gsum }

// maxConvEngaged bounds a Stepper's conversation memory (oldest first out, the same on every
// rank that saw the same steps).
const maxConvEngaged = 4096

// engageConv records that a rest_of_conversation gate engaged in a conversation.
func (s *Stepper) engageConv(k uint64) {
	if s.convEngaged == nil {
		s.convEngaged = map[uint64]bool{}
	}
	if s.convEngaged[k] {
		return
	}
	s.convEngaged[k] = true
	s.e.reportEngaged(k) // so the owner carries it engaged to the conversation's next request
	s.convOrder = append(s.convOrder, k)
	if len(s.convOrder) > maxConvEngaged {
		delete(s.convEngaged, s.convOrder[0])
		s.convOrder = s.convOrder[1:]
	}
}
