package steer

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/shmsteer/shmsteer/internal/proto"
	"github.com/shmsteer/shmsteer/shm"
)

// Probe vectors: named vectors of kind "probe", as the vLLM fork's vector registry keeps them.
// A probe is read by a gate (h·probe at its one (hook, layer) site), never added to hidden
// states, so it lives in its own region kind: the probe and steer namespaces are apart (a name
// may be both a probe and a steering vector, as in the fork), no steering set can reference a
// probe, and registering one recomposes nothing.

// KindProbe holds named probe vectors, key = name; the value is the steering wire encoding of
// one base vector.
const KindProbe shm.Kind = proto.KindProbe

// RPC ops for a worker's probe writes, served by Engine.Serve.
const (
	OpRegisterProbe   uint16 = proto.OpRegisterProbe
	OpUnregisterProbe uint16 = proto.OpUnregisterProbe
)

// ChangeProbe is a Change of a named probe vector (Change.Name).
const ChangeProbe ChangeKind = 3

// ErrProbeSite means a probe vector does not name exactly one (hook, layer) site.
var ErrProbeSite = errors.New("shmsteer: a probe vector must name exactly one (hook, layer)")

// VectorKind is the namespace of a named vector: steering vectors (KindVector) are added to
// hidden states through references; probes (KindProbe) are read by gates.
type VectorKind uint8

const (
	VectorSteer VectorKind = iota // "steer"
	VectorProbe                   // "probe"
)

// String is the fork's name of the kind: "steer" or "probe".
func (k VectorKind) String() string {
	if k == VectorProbe {
		return "probe"
	}
	return "steer"
}

// ParseVectorKind reads "steer" or "probe"; ok is false for anything else.
func ParseVectorKind(s string) (k VectorKind, ok bool) {
	switch s {
	case "steer":
		return VectorSteer, true
	case "probe":
		return VectorProbe, true
	}
	return 0, false
}

// encodeNamed validates the vectors of a named vector called name and encodes them.
func (e *Engine) encodeNamed(name string, vecs []Vector) (wire, []byte, error) {
	if err := checkName(name); err != nil {
		return wire{}, nil, err
	}
	if len(vecs) == 0 {
		return wire{}, nil, fmt.Errorf("%w: named vector %q", ErrEmptySet, name)
	}
	w, err := resolveSteering(e.cfg, &Steering{Base: Tier{Vectors: vecs}}, nil, false)
	if err != nil {
		return wire{}, nil, err
	}
	if err := checkMagnitude(e.cfg, &w, nil, fmt.Sprintf("named vector %q", name)); err != nil {
		return wire{}, nil, err
	}
	b, err := w.encode(e.cfg.Hidden)
	return w, b, err
}

// RegisterProbe validates vecs as Register does, plus exactly one entry (one (hook, layer)
// site, else ErrProbeSite), and stores them as probe vector name, replacing any earlier
// version. On a worker it sends them to the owner. Nothing is changed on failure.
func (e *Engine) RegisterProbe(name string, vecs []Vector) (VectorInfo, error) {
	return e.registerProbe(name, vecs, writeOpts{})
}

// RegisterProbeAs is RegisterProbe with a tagged Change and a condition, as RegisterAs.
func (e *Engine) RegisterProbeAs(origin, name string, vecs []Vector, cond func() error) (VectorInfo, error) {
	if err := e.ownerOnly(); err != nil {
		return VectorInfo{}, err
	}
	return e.registerProbe(name, vecs, writeOpts{origin: origin, cond: cond})
}

func (e *Engine) registerProbe(name string, vecs []Vector, o writeOpts) (VectorInfo, error) {
	if len(vecs) > 1 {
		return VectorInfo{}, fmt.Errorf("%w: probe vector %q names %d sites", ErrProbeSite, name, len(vecs))
	}
	w, b, err := e.encodeNamed(name, vecs)
	if err != nil {
		return VectorInfo{}, err
	}
	if e.r.IsOwner() {
		v, err := e.writeProbe(name, b, o)
		if err != nil {
			return VectorInfo{}, fmt.Errorf("register probe %q: %w", name, err)
		}
		return VectorInfo{Name: name, Version: v, Digest: w.digest}, nil
	}
	if e.opt.Caller == nil {
		return VectorInfo{}, ErrNotOwner
	}
	return e.callRegister(OpRegisterProbe, name, b)
}

// callRegister sends a register RPC (name, encoding) and reads its (version, digest) reply.
func (e *Engine) callRegister(op uint16, name string, b []byte) (VectorInfo, error) {
	req := binary.LittleEndian.AppendUint16(nil, uint16(len(name)))
	req = append(append(req, name...), b...)
	resp, err := e.call(op, req)
	if err != nil {
		return VectorInfo{}, err
	}
	if len(resp) != 8+32 {
		return VectorInfo{}, fmt.Errorf("%w: register reply of %d bytes", ErrBadEncoding, len(resp))
	}
	info := VectorInfo{Name: name, Version: binary.LittleEndian.Uint64(resp)}
	copy(info.Digest[:], resp[8:])
	return info, nil
}

// UnregisterProbe deletes a probe vector (from a worker, through the owner); ErrUnknownVector
// if it is not registered.
func (e *Engine) UnregisterProbe(name string) (uint64, error) {
	return e.unregisterProbe(name, writeOpts{})
}

// UnregisterProbeAs is UnregisterProbe with a tagged Change and a condition, as RegisterAs.
func (e *Engine) UnregisterProbeAs(origin, name string, cond func() error) (uint64, error) {
	if err := e.ownerOnly(); err != nil {
		return 0, err
	}
	return e.unregisterProbe(name, writeOpts{origin: origin, cond: cond})
}

func (e *Engine) unregisterProbe(name string, o writeOpts) (uint64, error) {
	if err := checkName(name); err != nil {
		return 0, err
	}
	if e.r.IsOwner() {
		return e.writeProbe(name, nil, o)
	}
	if e.opt.Caller == nil {
		return 0, ErrNotOwner
	}
	resp, err := e.call(OpUnregisterProbe, []byte(name))
	if err != nil {
		return 0, err
	}
	if len(resp) != 8 {
		return 0, fmt.Errorf("%w: unregister reply of %d bytes", ErrBadEncoding, len(resp))
	}
	return binary.LittleEndian.Uint64(resp), nil
}

// writeProbe stores (b != nil) or deletes a probe vector, under the write lock.
func (e *Engine) writeProbe(name string, b []byte, o writeOpts) (v uint64, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	defer o.done(e, &err, Change{Kind: ChangeProbe, Name: name, Deleted: b == nil}, &v)
	if err := o.check(); err != nil {
		return 0, err
	}
	return e.r.Update(func(tx *shm.Tx) error {
		if b != nil {
			return tx.Put(KindProbe, name, b)
		}
		if err := tx.Delete(KindProbe, name); err != nil {
			if errors.Is(err, shm.ErrNotFound) {
				return fmt.Errorf("%w: probe %q", ErrUnknownVector, name)
			}
			return err
		}
		return nil
	})
}

// Probe reads probe vector name at snapshot s without copying its floats (Vectors holds its
// one site).
func (e *Engine) Probe(s *shm.Snapshot, name string) (NamedVector, error) {
	return e.readNamed(s, KindProbe, name)
}

// ProbeInfos lists the probe vectors at snapshot s (index order).
func (e *Engine) ProbeInfos(s *shm.Snapshot) ([]VectorInfo, error) {
	return namedInfos(s, KindProbe)
}

func (e *Engine) readNamed(s *shm.Snapshot, kind shm.Kind, name string) (NamedVector, error) {
	if err := checkName(name); err != nil {
		return NamedVector{}, err
	}
	what := "named vector"
	if kind == KindProbe {
		what = "probe vector"
	}
	b, ver, err := s.View(kind, name)
	if errors.Is(err, shm.ErrNotFound) {
		return NamedVector{}, fmt.Errorf("%w: %s %q", ErrUnknownVector, what, name)
	} else if err != nil {
		return NamedVector{}, err
	}
	w, err := decode(b, e.cfg, false)
	if err != nil {
		return NamedVector{}, fmt.Errorf("%s %q: %w", what, name, err)
	}
	st := w.steering(e.cfg)
	return NamedVector{Name: name, Version: ver, Digest: w.digest, Vectors: st.Base.Vectors}, nil
}

func namedInfos(s *shm.Snapshot, kind shm.Kind) ([]VectorInfo, error) {
	var out []VectorInfo
	err := s.Range(kind, func(key, value []byte, version uint64) bool {
		d, _ := wireDigest(value)
		out = append(out, VectorInfo{Name: string(key), Version: version, Digest: d})
		return true
	})
	return out, err
}

// serveRegister is the owner's handler of a register RPC: it decodes (name, encoding),
// re-validates it and registers it with reg.
func (e *Engine) serveRegister(reg func(name string, vecs []Vector) (VectorInfo, error)) func([]byte) ([]byte, error) {
	return func(req []byte) ([]byte, error) {
		if len(req) < 2 || len(req) < 2+int(binary.LittleEndian.Uint16(req)) {
			return nil, fmt.Errorf("%w: short register request", ErrBadEncoding)
		}
		n := int(binary.LittleEndian.Uint16(req))
		name := string(req[2 : 2+n])
		// Copy so the floats are aligned whatever the transport's buffer offset.
		enc := append(make([]byte, 0, len(req)-2-n), req[2+n:]...)
		w, err := decode(enc, e.cfg, true)
		if err != nil {
			return nil, err
		}
		if len(w.refs) != 0 || len(w.clamps) != 0 {
			return nil, fmt.Errorf("%w: a named vector holds only base vectors", ErrBadEncoding)
		}
		info, err := reg(name, w.steering(e.cfg).Base.Vectors)
		if err != nil {
			return nil, err
		}
		return append(binary.LittleEndian.AppendUint64(nil, info.Version), info.Digest[:]...), nil
	}
}

// serveUnregister is the owner's handler of an unregister RPC (the request is the name).
func serveUnregister(unreg func(name string) (uint64, error)) func([]byte) ([]byte, error) {
	return func(req []byte) ([]byte, error) {
		v, err := unreg(string(req))
		if err != nil {
			return nil, err
		}
		return binary.LittleEndian.AppendUint64(nil, v), nil
	}
}
