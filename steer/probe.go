package steer

import (
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
func (e *Engine) RegisterProbe(name string, vecs []Vector, opts ...WriteOption) (VectorInfo, error) {
	o := writeOptsOf(opts)
	if o.hintSet {
		return VectorInfo{}, fmt.Errorf("%w: probe vector %q: only steering vectors carry a model hint", ErrBadModelHint, name)
	}
	if len(vecs) > 1 {
		return VectorInfo{}, fmt.Errorf("%w: probe vector %q names %d sites", ErrProbeSite, name, len(vecs))
	}
	w, b, err := e.encodeNamed(name, vecs)
	if err != nil {
		return VectorInfo{}, err
	}
	return e.w.putNamed(KindProbe, name, b, w.digest, o)
}

// UnregisterProbe deletes a probe vector (from a worker, through the owner); ErrUnknownVector
// if it is not registered.
func (e *Engine) UnregisterProbe(name string, opts ...WriteOption) (uint64, error) {
	if err := checkName(name); err != nil {
		return 0, err
	}
	return e.w.deleteNamed(KindProbe, name, writeOptsOf(opts))
}

// writeProbe stores (b != nil) or deletes a probe vector, under the write lock.
func (e *Owner) writeProbe(name string, b []byte, o writeOpts) (v uint64, err error) {
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
