package steer

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
)

// Effective is a request's effective steering at one (hook, layer, phase), as the current step
// of a Stepper applies it: Vec is global base + global phase + request base + request phase
// composed (nil when no vector applies there), Clamps the number of clamps applied after the
// add. Vec is the Stepper's process-private composition (not the shared region: issue 13 moves
// composition into the region) and is valid until the Stepper's next Begin, End or Close.
//
// Version is the newest region version among the entries it was composed from (the global
// steering, the request's entry and every named vector they reference). Digest identifies
// those inputs (each one's version and content digest, and which were missing), so two
// Effective values with equal digests hold equal floats: a device cache keyed by Digest
// re-uploads exactly when the composition changed.
type Effective struct {
	Vec     []float32
	Clamps  int
	Version uint64
	Digest  Digest
}

// Effective returns request id's effective steering at (hook, layer, phase) in the current
// step, composing it first if needed (as Apply would). It does not change the step's checksum.
func (s *Stepper) Effective(id string, hook HookID, layer int, phase Phase) (Effective, error) {
	if !s.open {
		return Effective{}, ErrNoStep
	}
	if int(hook) >= s.e.cfg.NumHooks() {
		return Effective{}, fmt.Errorf("%w: hook id %d", ErrUnknownHook, hook)
	}
	if layer < 0 || layer >= s.layers {
		return Effective{}, fmt.Errorf("%w: layer %d, model has %d", ErrLayerRange, layer, s.layers)
	}
	if id == "" || len(id) > MaxIDLen || (phase != PhasePrefill && phase != PhaseDecode) {
		return Effective{}, fmt.Errorf("%w: request %q phase %d", ErrBadBatch, id, phase)
	}
	st, err := s.request(id)
	if err != nil {
		return Effective{}, err
	}
	g := &s.global
	ix := (int(hook)*s.layers+layer)*2 + int(phase) - 1
	d := s.d
	var out Effective
	if g.has {
		if o := g.slot[ix]; o >= 0 {
			out.Vec = g.vecs[o : int(o)+d]
		}
		out.Clamps += int(g.cl[2*ix+1] - g.cl[2*ix])
	}
	if st.has {
		if o := st.slot[ix]; o >= 0 {
			out.Vec = st.vecs[o : int(o)+d]
		}
		out.Clamps += int(st.cl[2*ix+1] - st.cl[2*ix])
	}
	h := sha256.New()
	var w [8]byte
	add := func(c *comp) {
		out.Version = max(out.Version, c.ver)
		binary.LittleEndian.PutUint64(w[:], c.ver)
		h.Write(w[:])
		h.Write(c.digest[:])
		for _, dp := range c.deps {
			out.Version = max(out.Version, dp.ver)
			binary.LittleEndian.PutUint64(w[:], dp.ver)
			h.Write(w[:])
			binary.LittleEndian.PutUint64(w[:], uint64(len(dp.name)))
			h.Write(w[:])
			h.Write([]byte(dp.name))
		}
	}
	add(g)
	add(&st.comp)
	h.Sum(out.Digest[:0])
	return out, nil
}
