package steer

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"math"

	"github.com/shmsteer/shmsteer/internal/proto"
	"github.com/shmsteer/shmsteer/shm"
)

// A request's gates in the region: the owner resolves them at admission (names to the
// vectors registered then, every vector checked against the model) and stores them once under
// KindGates, in the same update as the request's steering, so every rank reads the same gates.
//
//	header (64 bytes): "SGAT", u16 format version (1), u16 gates, u32 hidden size,
//	                   u64 conversation hash (0: none), 12 bytes 0,
//	                   [32]byte sha256 of the whole encoding with these 32 bytes zeroed
//	per gate:
//	  64 bytes: u8 when, u8 scope, u8 apply, u8 flags (1: a rest_of_conversation gate engaged
//	            earlier in its conversation), f32 threshold, f32 sharpness, f32 strength,
//	            u16 probe name length, u16 steer name length, u32 probe wire length,
//	            u32 steer wire length, 36 bytes 0
//	  names: the probe's then the steer's name (empty for inline sources), zero padded to 64
//	  the probe's one vector, then the add's vectors, each in the steering wire format (its
//	  digest is the named vector's when the source is a name); empty when not used
//
// Every length is bounds-checked on decode (FuzzDecodeGateEntry).

// KindGates holds a request's resolved gates, key = request id.
const KindGates shm.Kind = proto.KindGates

const (
	gateMagic   = "SGAT"
	gateVersion = 1
	gateHdr     = 64
	// gateEngagedFlag marks a carried rest_of_conversation gate engaged (gates_conv.go).
	gateEngagedFlag = 1
)

// AdmittedGate is a gate as the owner stored it: its sources resolved, the vectors checked.
// Vector data alias the region (valid while the snapshot they were read at is open).
type AdmittedGate struct {
	When                 WhenKind
	Scope                GateScope
	Apply                ApplyKind
	Threshold, Sharpness float32
	Strength             float32
	// ProbeName is the probe vector's name ("" for an inline probe); ProbeDigest the digest of
	// the probe as resolved (the named vector's when named); Probe its one (hook, layer) site.
	ProbeName   string
	ProbeDigest Digest
	Probe       Vector
	// SteerName, SteerDigest and Steer are the add's source and vectors (before Strength).
	SteerName   string
	SteerDigest Digest
	Steer       []Vector
	// Engaged: a rest_of_conversation gate that engaged earlier in its conversation (the owner
	// heard it from a Stepper), so it applies from the request's first decode step.
	Engaged bool
}

// resolvedGate is an AdmittedGate in wire form, for encoding.
type resolvedGate struct {
	g                     *Gate
	probeName, steerName  string
	probeWire, steerWire  []byte
	probeDigest, steerDig Digest
	engaged               bool // rest_of_conversation: engaged earlier in the conversation
}

// resolveGates validates gates against the model and the vectors registered at snapshot s
// (nil when there are none). set names the request in errors.
func (e *Engine) resolveGates(s *shm.Snapshot, gates []Gate, set string) ([]resolvedGate, error) {
	if len(gates) == 0 {
		return nil, nil
	}
	if len(gates) > MaxGates {
		name := set
		if name == "" {
			name = "the request"
		}
		return nil, fmt.Errorf("%w: %s has %d gates, at most %d", ErrBadGate, name, len(gates), MaxGates)
	}
	if err := CheckGates(gates); err != nil {
		if set == "" {
			return nil, err
		}
		return nil, fmt.Errorf("%s: %w", set, err)
	}
	named := namedAt(s, e.cfg)
	res := make([]resolvedGate, len(gates))
	for i := range gates {
		g := &gates[i]
		r := &res[i]
		r.g = g
		where := fmt.Sprintf("steering[%d]", i)
		if set != "" {
			where = set + ": " + where
		}
		if g.When.Kind == WhenProbe {
			b, err := e.gateSource(s, KindProbe, &g.When.Probe, where+".when.probe")
			if err != nil {
				return nil, err
			}
			w, err := decode(b, e.cfg, false)
			if err != nil {
				return nil, fmt.Errorf("%s.when.probe: %w", where, err)
			}
			if len(w.vecs) != 1 || len(w.refs) != 0 || len(w.clamps) != 0 {
				return nil, fmt.Errorf("%w: %s.when.probe names %d sites", ErrProbeSite, where, len(w.vecs))
			}
			r.probeName, r.probeWire, r.probeDigest = g.When.Probe.Name, b, w.digest
		}
		if g.Apply.Kind == ApplyAdd {
			b, err := e.gateSource(s, KindVector, &g.Apply.Steer, where+".apply.steer")
			if err != nil {
				return nil, err
			}
			w, err := decode(b, e.cfg, false)
			if err != nil {
				return nil, fmt.Errorf("%s.apply.steer: %w", where, err)
			}
			if len(w.vecs) == 0 {
				return nil, fmt.Errorf("%w: %s.apply: an add must carry vectors", ErrBadGate, where)
			}
			scaled := w
			scaled.vecs = make([]wireVec, len(w.vecs))
			for j, v := range w.vecs {
				v.scale *= g.Apply.Strength
				scaled.vecs[j] = v
			}
			if err := checkMagnitude(e.cfg, &scaled, named, where+" add"); err != nil {
				return nil, err
			}
			r.steerName, r.steerWire, r.steerDig = g.Apply.Steer.Name, b, w.digest
		}
	}
	return res, nil
}

// CheckGatesAt checks gates as an admission at snapshot s resolves them, and changes nothing:
// every named source registered at s (a probe vector for a probe, a steering vector for an
// add: ErrUnknownVector), each probe at exactly one (hook, layer) (ErrProbeSite), every inline
// vector against the model (ErrUnknownHook, ErrLayerRange, ErrHiddenSize, ErrNonFinite, ...)
// and each add's magnitude (ErrOverflow), after the gates' form (CheckGates). set names the
// request in the errors as an admission does (`request "id"`); "" names none. What it refuses,
// an admission of the same gates at s refuses with the same error; an admission also bounds the
// request's steering and gates together (checkGateBound), which needs the owner's latches.
func (e *Engine) CheckGatesAt(s *shm.Snapshot, gates []Gate, set string) error {
	_, err := e.resolveGates(s, gates, set)
	return err
}

// gateSource returns the wire encoding of a source: a registered vector of kind (copied out of
// the snapshot) or the inline vectors, validated.
func (e *Engine) gateSource(s *shm.Snapshot, kind shm.Kind, src *GateSource, where string) ([]byte, error) {
	if src.Name != "" {
		b, _, err := s.View(kind, src.Name)
		if errors.Is(err, shm.ErrNotFound) {
			what := "steering"
			if kind == KindProbe {
				what = "probe"
			}
			return nil, fmt.Errorf("%w: %s: unknown %s vector name %q", ErrUnknownVector, where, what, src.Name)
		} else if err != nil {
			return nil, err
		}
		return append([]byte(nil), b...), nil
	}
	if kind == KindProbe && len(src.Vectors) != 1 {
		return nil, fmt.Errorf("%w: %s: an inline probe names %d sites", ErrProbeSite, where, len(src.Vectors))
	}
	w, err := resolveSteering(e.cfg, &Steering{Base: Tier{Vectors: src.Vectors}}, nil, false)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	return w.encode(e.cfg.Hidden)
}

// encodeGates encodes resolved gates (nil when there are none); conv is the hash of the
// request's conversation (0: none), which Steppers key rest_of_conversation state by.
func encodeGates(res []resolvedGate, hidden int, conv uint64) []byte {
	if len(res) == 0 {
		return nil
	}
	b := make([]byte, gateHdr)
	copy(b, gateMagic)
	le.PutUint16(b[4:], gateVersion)
	le.PutUint16(b[6:], uint16(len(res)))
	le.PutUint32(b[8:], uint32(hidden))
	le.PutUint64(b[12:], conv)
	for _, r := range res {
		h := make([]byte, gateHdr)
		h[0], h[1], h[2] = byte(r.g.When.Kind), byte(r.g.Scope), byte(r.g.Apply.Kind)
		if r.engaged {
			h[3] = gateEngagedFlag
		}
		le.PutUint32(h[4:], math.Float32bits(r.g.When.Threshold))
		le.PutUint32(h[8:], math.Float32bits(r.g.When.Sharpness))
		le.PutUint32(h[12:], math.Float32bits(r.g.Apply.Strength))
		le.PutUint16(h[16:], uint16(len(r.probeName)))
		le.PutUint16(h[18:], uint16(len(r.steerName)))
		le.PutUint32(h[20:], uint32(len(r.probeWire)))
		le.PutUint32(h[24:], uint32(len(r.steerWire)))
		b = append(b, h...)
		names := r.probeName + r.steerName
		b = append(b, names...)
		b = append(b, make([]byte, roundUp64(uint64(len(names)))-uint64(len(names)))...)
		b = append(b, r.probeWire...)
		b = append(b, r.steerWire...)
	}
	d := sha256.Sum256(b)
	copy(b[32:], d[:])
	return b
}

// gateConvOf reads the conversation hash of a KindGates value decodeGateEntry accepted.
func gateConvOf(b []byte) uint64 { return le.Uint64(b[12:]) }

// decodeGateEntry parses a KindGates value, checking every length against len(b) and every
// vector against cfg. Vector data alias b. With verify it also checks the digest.
func decodeGateEntry(b []byte, cfg ModelConfig, verify bool) ([]AdmittedGate, error) {
	bad := func(format string, args ...any) ([]AdmittedGate, error) {
		return nil, fmt.Errorf("%w: gates: "+format, append([]any{ErrBadEncoding}, args...)...)
	}
	if len(b) < gateHdr || string(b[:4]) != gateMagic {
		return bad("no header")
	}
	if v := le.Uint16(b[4:]); v != gateVersion {
		return bad("format version %d, this build reads %d", v, gateVersion)
	}
	if h := le.Uint32(b[8:]); int(h) != cfg.Hidden {
		return bad("hidden size %d, model has %d", h, cfg.Hidden)
	}
	if verify {
		h := sha256.New()
		h.Write(b[:32])
		h.Write(make([]byte, 32))
		h.Write(b[64:])
		if Digest(h.Sum(nil)) != Digest(b[32:64]) {
			return bad("digest mismatch")
		}
	}
	n := int(le.Uint16(b[6:]))
	if n > MaxGates {
		return bad("%d gates", n)
	}
	out := make([]AdmittedGate, n)
	off := uint64(gateHdr)
	size := uint64(len(b))
	for i := range out {
		if size-off < gateHdr {
			return bad("gate %d header past the end", i)
		}
		h := b[off : off+gateHdr]
		g := &out[i]
		g.When, g.Scope, g.Apply = WhenKind(h[0]), GateScope(h[1]), ApplyKind(h[2])
		g.Threshold = math.Float32frombits(le.Uint32(h[4:]))
		g.Sharpness = math.Float32frombits(le.Uint32(h[8:]))
		g.Strength = math.Float32frombits(le.Uint32(h[12:]))
		pn, sn := uint64(le.Uint16(h[16:])), uint64(le.Uint16(h[18:]))
		pl, sl := uint64(le.Uint32(h[20:])), uint64(le.Uint32(h[24:]))
		if g.When > WhenProbe || g.Scope >= numScopes || g.Apply > ApplyAttenuate || h[3]&^gateEngagedFlag != 0 ||
			h[3] != 0 && g.Scope != ScopeRestOfConversation {
			return bad("gate %d kinds (%d, %d, %d), flags %#x", i, h[0], h[1], h[2], h[3])
		}
		g.Engaged = h[3] != 0
		off += gateHdr
		nl := roundUp64(pn + sn)
		if size-off < nl || size-off-nl < pl || size-off-nl-pl < sl {
			return bad("gate %d lengths past the end", i)
		}
		g.ProbeName, g.SteerName = string(b[off:off+pn]), string(b[off+pn:off+pn+sn])
		off += nl
		if (g.When == WhenProbe) != (pl > 0) || (g.Apply == ApplyAdd) != (sl > 0) {
			return bad("gate %d sources do not match its kinds", i)
		}
		if pl > 0 {
			w, err := decode(b[off:off+pl:off+pl], cfg, false)
			if err != nil {
				return nil, fmt.Errorf("gate %d probe: %w", i, err)
			}
			if len(w.vecs) != 1 {
				return bad("gate %d probe has %d sites", i, len(w.vecs))
			}
			g.ProbeDigest = w.digest
			v := w.vecs[0]
			g.Probe = Vector{Hook: cfg.HookName(v.hook), Layer: v.layer, Scale: v.scale, Data: v.data}
			off += pl
		}
		if sl > 0 {
			w, err := decode(b[off:off+sl:off+sl], cfg, false)
			if err != nil {
				return nil, fmt.Errorf("gate %d steer: %w", i, err)
			}
			g.SteerDigest = w.digest
			for _, v := range w.vecs {
				g.Steer = append(g.Steer, Vector{Hook: cfg.HookName(v.hook), Layer: v.layer, Scale: v.scale, Data: v.data})
			}
			off += sl
		}
	}
	if off != size {
		return bad("%d trailing bytes", size-off)
	}
	return out, nil
}

// Gates reads the gates the owner stored for requestID at snapshot s (nil, nil when it was
// admitted without gates or is not admitted). Vector data alias the snapshot.
func (e *Engine) Gates(s *shm.Snapshot, requestID string) ([]AdmittedGate, error) {
	b, _, err := s.View(KindGates, requestID)
	if errors.Is(err, shm.ErrNotFound) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	return decodeGateEntry(b, e.cfg, false)
}

// putGates stores (enc != nil) or removes a request's gates inside an admission's update.
func putGates(tx *shm.Tx, requestID string, enc []byte) error {
	if enc != nil {
		return tx.Put(KindGates, requestID, enc)
	}
	if err := tx.Delete(KindGates, requestID); err != nil && !errors.Is(err, shm.ErrNotFound) {
		return err
	}
	return nil
}

// GateCounts counts the gates admitted requests carry (Engine.GateCounts).
type GateCounts struct {
	Requests int            // admitted requests with gates
	ByScope  map[string]int // gates per scope name (this_token, next_step, ...)
	ByApply  map[string]int // gates per action (add, attenuate)
	Probes   int            // gates with a probe trigger
}

// GateCounts counts the gates stored at snapshot s. Evaluations and fires are counted by each
// Stepper (StepStats), where the probes are read.
func (e *Engine) GateCounts(s *shm.Snapshot) (GateCounts, error) {
	c := GateCounts{ByScope: map[string]int{}, ByApply: map[string]int{}}
	for _, n := range scopeNames {
		c.ByScope[n] = 0
	}
	c.ByApply[ApplyAdd.String()], c.ByApply[ApplyAttenuate.String()] = 0, 0
	var err error
	rerr := s.Range(KindGates, func(key, value []byte, _ uint64) bool {
		var gs []AdmittedGate
		if gs, err = decodeGateEntry(value, e.cfg, false); err != nil {
			err = fmt.Errorf("request %q: %w", key, err)
			return false
		}
		c.Requests++
		for _, g := range gs {
			c.ByScope[g.Scope.String()]++
			c.ByApply[g.Apply.String()]++
			if g.When == WhenProbe {
				c.Probes++
			}
		}
		return true
	})
	if err == nil {
		err = rerr
	}
	return c, err
}
