package steer

// The steering wire format: how a steering set is stored in the region (named vectors, the
// global tiers, admitted request steering) and sent over RPC. Little-endian, versioned, and
// laid out so that vector data starts 64-byte aligned within the value (values are 64-byte
// aligned in the region), which lets readers use the floats in place.
//
//	header (64 bytes)
//	  0  magic "SSTR"
//	  4  u16 format version (1)
//	  6  u16 flags (bit 0: ComposeAdd)
//	  8  u32 hidden size
//	 12  u32 vectors, 16 u32 refs, 20 u32 clamps, 24 u32 names bytes, 28 u32 reserved (0)
//	 32  [32]byte sha256 of the whole encoding with these 32 bytes zeroed
//	vectors: 16 bytes each: u8 phase, u8 0, u16 hook, u32 layer, f32 scale, u32 0
//	refs:    48 bytes each: u8 phase, u8 0, u16 name length, u32 name offset, f32 strength,
//	         u32 0, [32]byte digest of the named vector when admitted (zero if unknown)
//	clamps:  32 bytes each: u8 phase, u8 0, u16 hook, u32 layer, f32 min, f32 max,
//	         f32 strength, u32 0, 8 bytes 0
//	names:   the refs' names, then zero padding to a multiple of 64
//	data:    one slot per vector then per clamp, each hidden float32s padded to 64 bytes
//
// Everything is bounds-checked on decode; FuzzDecodeRequestSteering exercises it.

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/shmsteer/shmsteer/kernels"
	"github.com/shmsteer/shmsteer/shm"
)

const (
	wireMagic   = "SSTR"
	wireVersion = 1
	hdrSize     = 64
	vecEntry    = 16
	refEntry    = 48
	clampEntry  = 32
	flagAdd     = 1
)

var le = binary.LittleEndian

type wireVec struct {
	phase Phase
	hook  HookID
	layer int
	scale float32
	data  []float32
}

type wireRef struct {
	phase    Phase
	name     string
	strength float32
	digest   Digest
}

type wireClamp struct {
	phase       Phase
	hook        HookID
	layer       int
	lo, hi, str float32
	dir         []float32
}

// wire is a decoded (or to-be-encoded) steering set. Decoded data slices alias the input.
type wire struct {
	compose Compose
	digest  Digest
	vecs    []wireVec
	refs    []wireRef
	clamps  []wireClamp
}

func roundUp64(n uint64) uint64 { return (n + 63) &^ 63 }

// resolveSteering validates s against cfg and returns its wire form. digestOf returns the
// digest of a named vector (ok false if it is not registered); nil skips the check and leaves
// digests zero. allowDup admits a (hook, layer) twice in a tier, as a latch composed with an
// override may hold.
func resolveSteering(cfg ModelConfig, s *Steering, digestOf func(string) (Digest, bool), allowDup bool) (wire, error) {
	w := wire{compose: s.Compose}
	if s.Compose > ComposeAdd {
		return w, fmt.Errorf("%w: unknown compose mode %d", ErrBadEncoding, s.Compose)
	}
	for _, p := range []Phase{PhaseBase, PhasePrefill, PhaseDecode} {
		t := s.Tier(p)
		first := len(w.vecs)
		for i := range t.Vectors {
			v := &t.Vectors[i]
			hook, err := checkSite(cfg, v.Hook, v.Layer)
			if err != nil {
				return w, fmt.Errorf("%s vector %d: %w", p, i, err)
			}
			if len(v.Data) != cfg.Hidden {
				return w, fmt.Errorf("%w: %s vector %d has %d floats, hidden size is %d", ErrHiddenSize, p, i, len(v.Data), cfg.Hidden)
			}
			if !finite(v.Scale) || !allFinite(v.Data) {
				return w, fmt.Errorf("%w: %s vector %d (%s, layer %d)", ErrNonFinite, p, i, v.Hook, v.Layer)
			}
			for _, o := range w.vecs[first:] {
				if !allowDup && o.hook == hook && o.layer == v.Layer {
					return w, fmt.Errorf("%w: %s vector %d (%s, layer %d)", ErrDuplicate, p, i, v.Hook, v.Layer)
				}
			}
			w.vecs = append(w.vecs, wireVec{phase: p, hook: hook, layer: v.Layer, scale: v.Scale, data: v.Data})
		}
		for i, r := range t.Refs {
			if err := checkName(r.Name); err != nil {
				return w, fmt.Errorf("%s ref %d: %w", p, i, err)
			}
			if !finite(r.Strength) {
				return w, fmt.Errorf("%w: %s ref %d (%q) strength", ErrNonFinite, p, i, r.Name)
			}
			wr := wireRef{phase: p, name: r.Name, strength: r.Strength}
			if digestOf != nil {
				d, ok := digestOf(r.Name)
				if !ok {
					return w, fmt.Errorf("%w: %s ref %d: %q", ErrUnknownVector, p, i, r.Name)
				}
				wr.digest = d
			}
			w.refs = append(w.refs, wr)
		}
		for i := range t.Clamps {
			c := &t.Clamps[i]
			hook, err := checkSite(cfg, c.Hook, c.Layer)
			if err != nil {
				return w, fmt.Errorf("%s clamp %d: %w", p, i, err)
			}
			if len(c.Dir) != cfg.Hidden {
				return w, fmt.Errorf("%w: %s clamp %d direction has %d floats, hidden size is %d", ErrHiddenSize, p, i, len(c.Dir), cfg.Hidden)
			}
			if !finite(c.Min) || !finite(c.Max) || !finite(c.Strength) || !allFinite(c.Dir) {
				return w, fmt.Errorf("%w: %s clamp %d", ErrNonFinite, p, i)
			}
			if c.Min > c.Max {
				return w, fmt.Errorf("%w: %s clamp %d min %g > max %g", ErrBadClamp, p, i, c.Min, c.Max)
			}
			norm := kernels.Norm(c.Dir)
			if norm == 0 || math.IsInf(norm, 0) || float32(1/norm) == 0 {
				return w, fmt.Errorf("%w: %s clamp %d direction has zero or unusable norm", ErrBadClamp, p, i)
			}
			u := make([]float32, len(c.Dir))
			for j, f := range c.Dir {
				u[j] = float32(float64(f) / norm)
			}
			w.clamps = append(w.clamps, wireClamp{phase: p, hook: hook, layer: c.Layer, lo: c.Min, hi: c.Max, str: c.Strength, dir: u})
		}
	}
	return w, nil
}

func checkSite(cfg ModelConfig, hook string, layer int) (HookID, error) {
	id, err := cfg.Hook(hook)
	if err != nil {
		return 0, err
	}
	if layer < 0 || layer >= cfg.Layers {
		return 0, fmt.Errorf("%w: layer %d, model has %d", ErrLayerRange, layer, cfg.Layers)
	}
	return id, nil
}

func checkName(name string) error {
	if len(name) == 0 || len(name) > MaxNameLen {
		return fmt.Errorf("%w (%d bytes)", ErrBadName, len(name))
	}
	return nil
}

// size returns the encoded size and the offsets of the names and data sections.
func (w *wire) layout(hidden int) (total, namesOff, dataOff, stride uint64) {
	var names uint64
	for _, r := range w.refs {
		names += uint64(len(r.name))
	}
	namesOff = hdrSize + uint64(len(w.vecs))*vecEntry + uint64(len(w.refs))*refEntry + uint64(len(w.clamps))*clampEntry
	dataOff = roundUp64(namesOff + names)
	stride = roundUp64(uint64(hidden) * 4)
	total = dataOff + uint64(len(w.vecs)+len(w.clamps))*stride
	return
}

// encode writes w in the wire format and sets w.digest.
func (w *wire) encode(hidden int) ([]byte, error) {
	total, namesOff, dataOff, stride := w.layout(hidden)
	if total > shm.MaxValueLen {
		return nil, fmt.Errorf("%w: steering set of %d bytes", shm.ErrValueTooLarge, total)
	}
	b := make([]byte, total)
	copy(b, wireMagic)
	le.PutUint16(b[4:], wireVersion)
	if w.compose == ComposeAdd {
		le.PutUint16(b[6:], flagAdd)
	}
	le.PutUint32(b[8:], uint32(hidden))
	le.PutUint32(b[12:], uint32(len(w.vecs)))
	le.PutUint32(b[16:], uint32(len(w.refs)))
	le.PutUint32(b[20:], uint32(len(w.clamps)))
	off := uint64(hdrSize)
	slot := dataOff
	putData := func(v []float32) {
		// Vectors are read back in place as float32s in the machine's order (decode's view,
		// shm.AsFloat32), which is the little-endian of the layout: copy them as such.
		if dst := shm.AsFloat32(b[slot : slot+uint64(len(v))*4]); dst != nil {
			copy(dst, v)
		} else {
			for i, f := range v {
				le.PutUint32(b[slot+uint64(i)*4:], math.Float32bits(f))
			}
		}
		slot += stride
	}
	for _, v := range w.vecs {
		e := b[off:]
		e[0] = byte(v.phase)
		le.PutUint16(e[2:], uint16(v.hook))
		le.PutUint32(e[4:], uint32(v.layer))
		le.PutUint32(e[8:], math.Float32bits(v.scale))
		off += vecEntry
		putData(v.data)
	}
	names := namesOff
	for _, r := range w.refs {
		e := b[off:]
		e[0] = byte(r.phase)
		le.PutUint16(e[2:], uint16(len(r.name)))
		le.PutUint32(e[4:], uint32(names-namesOff))
		le.PutUint32(e[8:], math.Float32bits(r.strength))
		copy(e[16:48], r.digest[:])
		copy(b[names:], r.name)
		names += uint64(len(r.name))
		off += refEntry
	}
	for _, c := range w.clamps {
		e := b[off:]
		e[0] = byte(c.phase)
		le.PutUint16(e[2:], uint16(c.hook))
		le.PutUint32(e[4:], uint32(c.layer))
		le.PutUint32(e[8:], math.Float32bits(c.lo))
		le.PutUint32(e[12:], math.Float32bits(c.hi))
		le.PutUint32(e[16:], math.Float32bits(c.str))
		off += clampEntry
		putData(c.dir)
	}
	le.PutUint32(b[24:], uint32(names-namesOff))
	w.digest = sha256.Sum256(b)
	copy(b[32:64], w.digest[:])
	return b, nil
}

// wireDigest reads the digest recorded in an encoding without decoding the rest.
func wireDigest(b []byte) (Digest, error) {
	var d Digest
	if len(b) < hdrSize || string(b[:4]) != wireMagic {
		return d, fmt.Errorf("%w: no header", ErrBadEncoding)
	}
	copy(d[:], b[32:64])
	return d, nil
}

// decode parses b, checking every count, offset and length against len(b) and every hook and
// layer against cfg. Vector data alias b. With verify it also checks the digest and that every
// float is finite (the owner validated what it wrote; verify is for untrusted bytes).
func decode(b []byte, cfg ModelConfig, verify bool) (wire, error) {
	var w wire
	lay, err := decodeHeader(b, cfg, &w)
	if err != nil {
		return wire{}, err
	}
	if err := checkWireBody(b, lay, w.digest, verify); err != nil {
		return wire{}, err
	}
	r := wireReader{b: b, cfg: cfg, verify: verify, lay: lay, off: hdrSize, slot: lay.dataOff}
	if w.vecs, err = r.vectors(); err != nil {
		return wire{}, err
	}
	if w.refs, err = r.refs(); err != nil {
		return wire{}, err
	}
	if w.clamps, err = r.clamps(); err != nil {
		return wire{}, err
	}
	return w, nil
}

// badWire is an ErrBadEncoding with what is wrong.
func badWire(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrBadEncoding}, args...)...)
}

// wireLayout is an encoding's entry counts and where its sections start, from its header.
type wireLayout struct {
	nv, nr, nc, nn    uint64 // vectors, refs, clamps, name bytes
	namesOff, dataOff uint64
	stride            uint64 // bytes per data row
}

// decodeHeader checks b's header against cfg and len(b), sets w's compose mode and recorded
// digest, and returns the layout.
func decodeHeader(b []byte, cfg ModelConfig, w *wire) (wireLayout, error) {
	var lay wireLayout
	if len(b) < hdrSize || string(b[:4]) != wireMagic {
		return lay, badWire("no header")
	}
	if v := le.Uint16(b[4:]); v != wireVersion {
		return lay, badWire("format version %d, this build reads %d", v, wireVersion)
	}
	flags := le.Uint16(b[6:])
	if flags&^flagAdd != 0 || le.Uint32(b[28:]) != 0 {
		return lay, badWire("unknown flags")
	}
	if flags&flagAdd != 0 {
		w.compose = ComposeAdd
	}
	if h := le.Uint32(b[8:]); int(h) != cfg.Hidden {
		return lay, badWire("hidden size %d, model has %d", h, cfg.Hidden)
	}
	lay.nv, lay.nr, lay.nc, lay.nn = uint64(le.Uint32(b[12:])), uint64(le.Uint32(b[16:])), uint64(le.Uint32(b[20:])), uint64(le.Uint32(b[24:]))
	copy(w.digest[:], b[32:64])
	lay.stride = roundUp64(uint64(cfg.Hidden) * 4)
	lay.namesOff = hdrSize + lay.nv*vecEntry + lay.nr*refEntry + lay.nc*clampEntry // < 2^39, no overflow
	lay.dataOff = roundUp64(lay.namesOff + lay.nn)
	if total := lay.dataOff + (lay.nv+lay.nc)*lay.stride; total != uint64(len(b)) {
		return lay, badWire("length %d, header implies %d", len(b), total)
	}
	return lay, nil
}

// checkWireBody checks the digest (with verify) and that the padding after the names is zero.
func checkWireBody(b []byte, lay wireLayout, digest Digest, verify bool) error {
	if verify {
		h := sha256.New()
		h.Write(b[:32])
		h.Write(make([]byte, 32))
		h.Write(b[64:])
		if Digest(h.Sum(nil)) != digest {
			return badWire("digest mismatch")
		}
	}
	for i := lay.namesOff + lay.nn; i < lay.dataOff; i++ {
		if b[i] != 0 {
			return badWire("nonzero padding")
		}
	}
	return nil
}

// wireReader walks an encoding's entries (off) and data rows (slot) in order, after
// decodeHeader has checked that every section lies within b.
type wireReader struct {
	b         []byte
	cfg       ModelConfig
	verify    bool
	lay       wireLayout
	off, slot uint64
}

// entry returns the next n-byte entry.
func (r *wireReader) entry(n uint64) []byte {
	e := r.b[r.off : r.off+n]
	r.off += n
	return e
}

// site reads an entry's (hook, layer) and whether the model has them.
func (r *wireReader) site(e []byte) (HookID, int, bool) {
	hook, layer := HookID(le.Uint16(e[2:])), le.Uint32(e[4:])
	return hook, int(layer), int(hook) < r.cfg.NumHooks() && uint64(layer) < uint64(r.cfg.Layers)
}

// view returns the next data row, false if misaligned or (with verify) not finite.
func (r *wireReader) view() ([]float32, bool) {
	v := shm.AsFloat32(r.b[r.slot : r.slot+uint64(r.cfg.Hidden)*4])
	r.slot += r.lay.stride
	return v, v != nil && (!r.verify || allFinite(v))
}

// wirePhaseOK reports whether p is a phase (base, prefill or decode).
func wirePhaseOK(p byte) bool { return p <= byte(PhaseDecode) }

// vectors reads the vector entries and their data rows.
func (r *wireReader) vectors() ([]wireVec, error) {
	vecs := make([]wireVec, 0, r.lay.nv)
	for i := range r.lay.nv {
		e := r.entry(vecEntry)
		hook, layer, ok := r.site(e)
		if !wirePhaseOK(e[0]) || e[1] != 0 || !ok || le.Uint32(e[12:]) != 0 {
			return nil, badWire("vector %d: bad phase, hook or layer", i)
		}
		scale := math.Float32frombits(le.Uint32(e[8:]))
		data, ok := r.view()
		if !ok || (r.verify && !finite(scale)) {
			return nil, badWire("vector %d: misaligned or non-finite data", i)
		}
		vecs = append(vecs, wireVec{phase: Phase(e[0]), hook: hook, layer: layer, scale: scale, data: data})
	}
	return vecs, nil
}

// refs reads the reference entries and their names.
func (r *wireReader) refs() ([]wireRef, error) {
	refs := make([]wireRef, 0, r.lay.nr)
	nn, namesOff := r.lay.nn, r.lay.namesOff
	for i := range r.lay.nr {
		e := r.entry(refEntry)
		nl, no := uint64(le.Uint16(e[2:])), uint64(le.Uint32(e[4:]))
		if !wirePhaseOK(e[0]) || e[1] != 0 || nl == 0 || nl > MaxNameLen || no > nn || nl > nn-no || le.Uint32(e[12:]) != 0 {
			return nil, badWire("ref %d: bad phase or name", i)
		}
		ref := wireRef{phase: Phase(e[0]), name: string(r.b[namesOff+no : namesOff+no+nl]), strength: math.Float32frombits(le.Uint32(e[8:]))}
		if r.verify && !finite(ref.strength) {
			return nil, badWire("ref %d: non-finite strength", i)
		}
		copy(ref.digest[:], e[16:48])
		refs = append(refs, ref)
	}
	return refs, nil
}

// clamps reads the clamp entries and their direction rows.
func (r *wireReader) clamps() ([]wireClamp, error) {
	clamps := make([]wireClamp, 0, r.lay.nc)
	for i := range r.lay.nc {
		e := r.entry(clampEntry)
		hook, layer, ok := r.site(e)
		if !wirePhaseOK(e[0]) || e[1] != 0 || !ok || le.Uint32(e[20:]) != 0 || le.Uint64(e[24:]) != 0 {
			return nil, badWire("clamp %d: bad phase, hook or layer", i)
		}
		c := wireClamp{phase: Phase(e[0]), hook: hook, layer: layer,
			lo: math.Float32frombits(le.Uint32(e[8:])), hi: math.Float32frombits(le.Uint32(e[12:])), str: math.Float32frombits(le.Uint32(e[16:]))}
		dir, ok := r.view()
		if !ok || (r.verify && (!finite(c.lo) || !finite(c.hi) || !finite(c.str) || c.lo > c.hi)) {
			return nil, badWire("clamp %d: misaligned or non-finite data or bounds", i)
		}
		c.dir = dir
		clamps = append(clamps, c)
	}
	return clamps, nil
}

// steering converts a decoded wire back to the public form (data still aliasing the input).
func (w *wire) steering(cfg ModelConfig) Steering {
	s := Steering{Compose: w.compose}
	for _, v := range w.vecs {
		t := s.Tier(v.phase)
		t.Vectors = append(t.Vectors, Vector{Hook: cfg.HookName(v.hook), Layer: v.layer, Scale: v.scale, Data: v.data})
	}
	for _, r := range w.refs {
		t := s.Tier(r.phase)
		t.Refs = append(t.Refs, Ref{Name: r.name, Strength: r.strength})
	}
	for _, c := range w.clamps {
		t := s.Tier(c.phase)
		t.Clamps = append(t.Clamps, Clamp{Hook: cfg.HookName(c.hook), Layer: c.layer, Dir: c.dir, Min: c.lo, Max: c.hi, Strength: c.str})
	}
	return s
}

// DecodeSteering parses and fully verifies (digest, bounds, finite values) a steering set in
// the wire format, as stored under KindRequest, KindGlobal or KindVector. Vector data alias b.
func DecodeSteering(b []byte, cfg ModelConfig) (Steering, Digest, error) {
	w, err := decode(b, cfg, true)
	if err != nil {
		return Steering{}, Digest{}, err
	}
	return w.steering(cfg), w.digest, nil
}

// EncodeSteering validates s against cfg (named references are not resolved) and encodes it in
// the wire format, returning its digest.
func EncodeSteering(s *Steering, cfg ModelConfig) ([]byte, Digest, error) {
	w, err := resolveSteering(cfg, s, nil, false)
	if err != nil {
		return nil, Digest{}, err
	}
	b, err := w.encode(cfg.Hidden)
	return b, w.digest, err
}
