package steer

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
)

// Effective is a request's effective steering at one (hook, layer, phase), as the current step
// of a Stepper applies it: Request (the request's own steering, composed) plus Global (the
// global steering, composed), each nil when nothing of it applies there, then Clamps clamps.
// Both are the owner's compositions read in place: they alias the shared region (read-only,
// zero bytes copied) and are valid until the Stepper's next Begin, End or Close.
//
// Version is the newer of the two compositions' region versions. Digest identifies both (each
// one's version and content digest), so two Effective values with equal digests hold equal
// floats: a device cache keyed by Digest re-uploads exactly when the composition changed.
type Effective struct {
	Request []float32
	Global  []float32
	Clamps  int
	Version uint64
	Digest  Digest
}

// Sum returns Request + Global in a new slice (nil when neither applies): what a step adds to
// a row before the clamps. It copies; the fields themselves do not.
func (e Effective) Sum() []float32 {
	switch {
	case e.Request == nil && e.Global == nil:
		return nil
	case e.Global == nil:
		return append([]float32(nil), e.Request...)
	case e.Request == nil:
		return append([]float32(nil), e.Global...)
	}
	out := make([]float32, len(e.Request))
	for i := range out {
		out[i] = e.Request[i] + e.Global[i]
	}
	return out
}

// Effective returns request id's effective steering at (hook, layer, phase) in the current
// step, reading its composition if needed (as Apply would). It does not change the step's
// checksum.
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
	ix := (int(hook)*s.layers+layer)*2 + int(phase) - 1
	var out Effective
	var gcl, rcl []byte
	out.Global, gcl, _ = s.global.at(ix)
	out.Request, rcl, _ = st.view.at(ix)
	out.Clamps = (len(gcl) + len(rcl)) / clampRec
	h := sha256.New()
	var w [8]byte
	for _, v := range []*composedView{&s.global, &st.view} {
		out.Version = max(out.Version, v.version)
		binary.LittleEndian.PutUint64(w[:], v.version)
		h.Write(w[:])
		h.Write(v.digest[:])
	}
	h.Sum(out.Digest[:0])
	return out, nil
}
