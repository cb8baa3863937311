package serve

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"

	"github.com/shmsteer/shmsteer/steer"
)

// ErrBadInput means a request body or a steering payload is malformed (bad JSON, unknown
// field, bad dtype, shape or base64); the message says what.
var ErrBadInput = errors.New("shmsteer: bad request")

func badInput(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrBadInput}, args...)...)
}

// VectorSpec is one tier of vectors: hook → either a packed blob or {layer: entry}.
type VectorSpec map[string]json.RawMessage

// ClampSpec is one tier of clamps: hook → {layer: [clamp entry] | clamp entry}.
type ClampSpec map[string]map[string]json.RawMessage

// Packed is the fork's binary-wire hook blob: rows of layer vectors, base64 little-endian.
type Packed struct {
	Dtype        string    `json:"dtype"`
	Shape        []int     `json:"shape"`
	LayerIndices []int     `json:"layer_indices"`
	Data         string    `json:"data"`
	Scales       []float64 `json:"scales,omitempty"`
}

// SetRequest is the body of POST /v1/steering/set (and of `steer global set --file`).
type SetRequest struct {
	Vectors           VectorSpec         `json:"vectors,omitempty"`
	PrefillVectors    VectorSpec         `json:"prefill_vectors,omitempty"`
	DecodeVectors     VectorSpec         `json:"decode_vectors,omitempty"`
	Clamps            ClampSpec          `json:"clamps,omitempty"`
	PrefillClamps     ClampSpec          `json:"prefill_clamps,omitempty"`
	DecodeClamps      ClampSpec          `json:"decode_clamps,omitempty"`
	VectorRefs        map[string]float32 `json:"vector_refs,omitempty"`
	PrefillVectorRefs map[string]float32 `json:"prefill_vector_refs,omitempty"`
	DecodeVectorRefs  map[string]float32 `json:"decode_vector_refs,omitempty"`
	Replace           bool               `json:"replace,omitempty"`
	Target            *string            `json:"target,omitempty"`
}

// decodeStrict decodes one JSON value, refusing unknown fields and trailing data.
func decodeStrict(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return badInput("%v", err)
	}
	if d.More() {
		return badInput("trailing data after the JSON body")
	}
	return nil
}

// Steering converts the request to steering tiers (validated against cfg by steer later;
// shape, dtype and layer-key errors are found here).
func (r *SetRequest) Steering(cfg steer.ModelConfig) (steer.Steering, error) {
	var s steer.Steering
	for _, t := range []struct {
		phase steer.Phase
		vecs  VectorSpec
		cl    ClampSpec
		refs  map[string]float32
		name  string
	}{{steer.PhaseBase, r.Vectors, r.Clamps, r.VectorRefs, "vectors"},
		{steer.PhasePrefill, r.PrefillVectors, r.PrefillClamps, r.PrefillVectorRefs, "prefill_vectors"},
		{steer.PhaseDecode, r.DecodeVectors, r.DecodeClamps, r.DecodeVectorRefs, "decode_vectors"}} {
		tier := s.Tier(t.phase)
		vs, err := parseVectorSpec(t.vecs, cfg.Hidden)
		if err != nil {
			return s, fmt.Errorf("%s: %w", t.name, err)
		}
		tier.Vectors = vs
		cs, err := parseClampSpec(t.cl)
		if err != nil {
			return s, fmt.Errorf("%s clamps: %w", t.name, err)
		}
		tier.Clamps = cs
		names := make([]string, 0, len(t.refs))
		for n := range t.refs {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			tier.Refs = append(tier.Refs, steer.Ref{Name: n, Strength: t.refs[n]})
		}
	}
	return s, nil
}

func parseLayer(k string) (int, error) {
	n, err := strconv.Atoi(k)
	if err != nil || n < 0 {
		return 0, badInput("layer key %q is not a non-negative integer", k)
	}
	return n, nil
}

// parseVectorSpec reads one tier; vectors come out sorted by hook then layer.
func parseVectorSpec(spec VectorSpec, hidden int) ([]steer.Vector, error) {
	hooks := make([]string, 0, len(spec))
	for h := range spec {
		hooks = append(hooks, h)
	}
	sort.Strings(hooks)
	var out []steer.Vector
	for _, hook := range hooks {
		raw := spec[hook]
		var probe map[string]json.RawMessage
		if err := json.Unmarshal(raw, &probe); err != nil {
			return nil, badInput("hook %q: want an object of layers or a packed blob", hook)
		}
		if _, packed := probe["data"]; packed {
			p, err := packedFrom(probe)
			if err != nil {
				return nil, fmt.Errorf("hook %q packed: %w", hook, err)
			}
			vs, err := p.Vectors(hook, hidden)
			if err != nil {
				return nil, err
			}
			out = append(out, vs...)
			continue
		}
		layers := make([]int, 0, len(probe))
		byLayer := map[int]json.RawMessage{}
		for k, v := range probe {
			l, err := parseLayer(k)
			if err != nil {
				return nil, fmt.Errorf("hook %q: %w", hook, err)
			}
			if _, dup := byLayer[l]; dup {
				return nil, badInput("hook %q: layer %d given twice", hook, l)
			}
			byLayer[l] = v
			layers = append(layers, l)
		}
		slices.Sort(layers)
		for _, l := range layers {
			v, err := parseEntry(byLayer[l])
			if err != nil {
				return nil, fmt.Errorf("hook %q layer %d: %w", hook, l, err)
			}
			v.Hook, v.Layer = hook, l
			out = append(out, v)
		}
	}
	return out, nil
}

// packedFrom builds a Packed from an object already split into fields, refusing unknown ones.
// The base64 data is taken straight from between its quotes when it holds no escape (base64
// needs none), which saves decoding a multi-megabyte string twice.
func packedFrom(fields map[string]json.RawMessage) (Packed, error) {
	var p Packed
	for k, v := range fields {
		var dst any
		switch k {
		case "dtype":
			dst = &p.Dtype
		case "shape":
			dst = &p.Shape
		case "layer_indices":
			dst = &p.LayerIndices
		case "scales":
			dst = &p.Scales
		case "data":
			if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' && bytes.IndexByte(v, '\\') < 0 {
				p.Data = string(v[1 : len(v)-1])
				continue
			}
			dst = &p.Data
		default:
			return p, badInput("unknown field %q", k)
		}
		if err := json.Unmarshal(v, dst); err != nil {
			return p, badInput("field %q: %v", k, err)
		}
	}
	return p, nil
}

// parseEntry reads [floats] or {"vector": [floats], "scale": s}.
func parseEntry(raw json.RawMessage) (steer.Vector, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '[' {
		var d []float32
		if err := json.Unmarshal(raw, &d); err != nil {
			return steer.Vector{}, badInput("vector: %v", err)
		}
		return steer.Vector{Scale: 1, Data: d}, nil
	}
	var e struct {
		Vector []float32 `json:"vector"`
		Scale  *float64  `json:"scale"`
	}
	if err := decodeStrict(raw, &e); err != nil {
		return steer.Vector{}, err
	}
	if e.Vector == nil {
		return steer.Vector{}, badInput("entry needs \"vector\"")
	}
	v := steer.Vector{Scale: 1, Data: e.Vector}
	if e.Scale != nil {
		v.Scale = float32(*e.Scale) // beyond float32: ±Inf, refused by steer as non-finite
	}
	return v, nil
}

func parseClampSpec(spec ClampSpec) ([]steer.Clamp, error) {
	hooks := make([]string, 0, len(spec))
	for h := range spec {
		hooks = append(hooks, h)
	}
	sort.Strings(hooks)
	var out []steer.Clamp
	for _, hook := range hooks {
		var layers []int
		byLayer := map[int]json.RawMessage{}
		for k, v := range spec[hook] {
			l, err := parseLayer(k)
			if err != nil {
				return nil, fmt.Errorf("hook %q: %w", hook, err)
			}
			byLayer[l] = v
			layers = append(layers, l)
		}
		slices.Sort(layers)
		for _, l := range layers {
			raw := bytes.TrimSpace(byLayer[l])
			var entries []json.RawMessage
			if len(raw) > 0 && raw[0] == '[' {
				if err := json.Unmarshal(raw, &entries); err != nil {
					return nil, badInput("hook %q layer %d: %v", hook, l, err)
				}
			} else {
				entries = []json.RawMessage{raw}
			}
			for i, e := range entries {
				c, err := parseClamp(e)
				if err != nil {
					return nil, fmt.Errorf("hook %q layer %d clamp %d: %w", hook, l, i, err)
				}
				c.Hook, c.Layer = hook, l
				out = append(out, c)
			}
		}
	}
	return out, nil
}

// parseClamp reads {vector, min?, max?, strength?} or {vector, value, strength?}. An open
// bound is ±openBound, just below steer.MaxMagnitude (no projection reaches it); strength defaults to 1 and must be
// in [0, 1].
func parseClamp(raw json.RawMessage) (steer.Clamp, error) {
	var e struct {
		Vector   []float32 `json:"vector"`
		Min      *float32  `json:"min"`
		Max      *float32  `json:"max"`
		Value    *float32  `json:"value"`
		Strength *float32  `json:"strength"`
	}
	if err := decodeStrict(raw, &e); err != nil {
		return steer.Clamp{}, err
	}
	if len(e.Vector) == 0 {
		return steer.Clamp{}, badInput("clamp needs a non-empty \"vector\"")
	}
	c := steer.Clamp{Dir: e.Vector, Min: -openBound, Max: openBound, Strength: 1}
	switch {
	case e.Value != nil && (e.Min != nil || e.Max != nil):
		return c, badInput("clamp \"value\" excludes \"min\" and \"max\"")
	case e.Value != nil:
		c.Min, c.Max = *e.Value, *e.Value
	case e.Min == nil && e.Max == nil:
		return c, badInput("clamp needs \"value\", \"min\" or \"max\"")
	}
	if e.Min != nil {
		c.Min = *e.Min
	}
	if e.Max != nil {
		c.Max = *e.Max
	}
	if e.Strength != nil {
		c.Strength = *e.Strength
	}
	if !(c.Strength >= 0 && c.Strength <= 1) {
		return c, badInput("clamp strength %g not in [0, 1]", c.Strength)
	}
	return c, nil
}

// openBound is the largest float32 not above steer.MaxMagnitude (float32(1e30) rounds up).
var openBound = math.Nextafter32(float32(steer.MaxMagnitude), 0)

var dtypeSize = map[string]int{"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}

// Vectors decodes a packed blob into one vector per row (float32; values that overflow
// float32 become ±Inf and are refused by steer as non-finite).
func (p *Packed) Vectors(hook string, hidden int) ([]steer.Vector, error) {
	size, ok := dtypeSize[p.Dtype]
	if !ok {
		return nil, badInput("hook %q: dtype %q: want float16, bfloat16, float32 or float64", hook, p.Dtype)
	}
	if len(p.Shape) != 2 || p.Shape[0] < 1 || p.Shape[1] < 1 {
		return nil, badInput("hook %q: shape %v: want [rows, hidden]", hook, p.Shape)
	}
	rows, h := p.Shape[0], p.Shape[1]
	if h != hidden {
		return nil, badInput("hook %q: shape %v: hidden size is %d", hook, p.Shape, hidden)
	}
	if len(p.LayerIndices) != rows {
		return nil, badInput("hook %q: %d layer_indices for %d rows", hook, len(p.LayerIndices), rows)
	}
	if p.Scales != nil && len(p.Scales) != rows {
		return nil, badInput("hook %q: %d scales for %d rows", hook, len(p.Scales), rows)
	}
	want := rows * h * size
	if base64.StdEncoding.DecodedLen(len(p.Data)) < want || rows > 1<<20 {
		return nil, badInput("hook %q: data too short for shape %v %s", hook, p.Shape, p.Dtype)
	}
	raw, err := base64.StdEncoding.DecodeString(p.Data)
	if err != nil {
		return nil, badInput("hook %q: data is not base64: %v", hook, err)
	}
	if len(raw) != want {
		return nil, badInput("hook %q: data is %d bytes, shape %v of %s needs %d", hook, len(raw), p.Shape, p.Dtype, want)
	}
	out := make([]steer.Vector, rows)
	flat := make([]float32, rows*h)
	for i := range flat {
		b := raw[i*size:]
		switch p.Dtype {
		case "float16":
			flat[i] = halfToFloat32(binary.LittleEndian.Uint16(b))
		case "bfloat16":
			flat[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(b)) << 16)
		case "float32":
			flat[i] = math.Float32frombits(binary.LittleEndian.Uint32(b))
		case "float64":
			flat[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(b)))
		}
	}
	for r := range rows {
		out[r] = steer.Vector{Hook: hook, Layer: p.LayerIndices[r], Scale: 1, Data: flat[r*h : (r+1)*h : (r+1)*h]}
		if p.Scales != nil {
			out[r].Scale = float32(p.Scales[r])
		}
	}
	return out, nil
}

// halfToFloat32 converts an IEEE 754 binary16 to float32 exactly.
func halfToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf or NaN
		return math.Float32frombits(sign | 0xff<<23 | mant<<13)
	case exp != 0: // normal
		return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign)
	}
	// subnormal: mant × 2^-24
	f := float32(mant) * (1.0 / (1 << 24))
	if sign != 0 {
		f = -f
	}
	return f
}

// PackVectors encodes vectors of one hook as a float32 packed blob (for clients and tests).
func PackVectors(vs []steer.Vector) Packed {
	p := Packed{Dtype: "float32", Shape: []int{len(vs), 0}}
	var raw []byte
	for _, v := range vs {
		p.Shape[1] = len(v.Data)
		p.LayerIndices = append(p.LayerIndices, v.Layer)
		p.Scales = append(p.Scales, float64(v.Scale))
		for _, f := range v.Data {
			raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(f))
		}
	}
	p.Data = base64.StdEncoding.EncodeToString(raw)
	return p
}
