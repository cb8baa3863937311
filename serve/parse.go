package serve

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/shmsteer/shmsteer/steer"
	"github.com/shmsteer/shmsteer/steer/vecfile"
)

// ErrBadInput means a request body or a steering payload is malformed (bad JSON, unknown
// field, bad dtype, shape or base64); the message says what.
var ErrBadInput = errors.New("shmsteer: bad request")

func badInput(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrBadInput}, args...)...)
}

// malformedText starts the message of every structural error in a steering payload, as the
// fork's routers word it (its tests look for it).
const malformedText = "Malformed steering payload: "

// malformed is a structural error in a steering payload at path (the fork's
// field['hook'][layer] notation).
func malformed(path, format string, args ...any) error {
	return malformedAs(ErrBadInput, path, format, args...)
}

// malformedAs is malformed with another sentinel (steer.ErrBadClamp, steer.ErrNonFinite, ...).
func malformedAs(sentinel error, path, format string, args ...any) error {
	if path != "" {
		path += ": "
	}
	return &payloadError{sentinel: sentinel, msg: path + fmt.Sprintf(format, args...)}
}

// payloadError is a structural error in a steering payload: the fork's routers prefix its
// message with "Malformed steering payload: "; its per-request validation (OpenAI bodies)
// does not, so AdmissionFromRequest takes msg alone.
type payloadError struct {
	sentinel error
	msg      string
}

func (e *payloadError) Error() string { return e.sentinel.Error() + ": " + malformedText + e.msg }
func (e *payloadError) Unwrap() error { return e.sentinel }

// pyStr quotes s as Python's repr does, since the fork's messages (and its tests) use it.
func pyStr(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`, "\n", `\n`).Replace(s) + "'"
}

// pyList formats names as a Python list of strings: ['a', 'b'].
func pyList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = pyStr(n)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// intList formats xs as a Python list: [0, 3].
func intList(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return "[" + strings.Join(s, ", ") + "]"
}

// jsonKind names the JSON type of a raw value as Python does (the fork reports type(x).__name__).
func jsonKind(raw []byte) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '{':
		return "dict"
	case '[':
		return "list"
	case '"':
		return "str"
	case 't', 'f':
		return "bool"
	case 'n':
		return "NoneType"
	}
	return "float"
}

// goKindJSON names a Go decoding target in JSON terms, for messages that never show Go types.
func goKindJSON(t string) string {
	switch {
	case strings.HasPrefix(t, "map["), strings.HasPrefix(t, "struct"), strings.HasPrefix(t, "serve."):
		return "an object"
	case strings.HasPrefix(t, "[]"):
		return "an array"
	case t == "string":
		return "a string"
	case t == "bool":
		return "true or false"
	case strings.HasPrefix(t, "int"), strings.HasPrefix(t, "uint"):
		return "an integer"
	case strings.HasPrefix(t, "float"):
		return "a number"
	}
	return "another type"
}

// describeJSONError words a decoding error for the client without Go's decoder internals (type
// and struct names): what is wrong and where.
func describeJSONError(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("body is not valid JSON at byte %d: %s", se.Offset, strings.TrimPrefix(se.Error(), "json: "))
	case errors.As(err, &te):
		where := te.Field
		if where == "" {
			where = "the body"
		}
		got := te.Value
		if got == "number" || strings.HasPrefix(got, "number ") {
			got = "a " + got
		} else {
			got = "an " + got
			if strings.HasPrefix(te.Value, "s") || strings.HasPrefix(te.Value, "b") {
				got = "a " + te.Value
			}
		}
		return fmt.Sprintf("%s: want %s, got %s", where, goKindJSON(te.Type.String()), got)
	case errors.Is(err, io.EOF):
		return "empty body: want one JSON object"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "body ends early: want one JSON object"
	}
	msg := strings.TrimPrefix(err.Error(), "json: ")
	if f, ok := strings.CutPrefix(msg, "unknown field "); ok {
		return "unknown field " + f
	}
	return msg
}

// tierVectors is one tier of vectors: hook → either a packed blob or {layer: entry}.
type tierVectors map[string]json.RawMessage

// tierClamps is one tier of clamps: hook → {layer: [clamp entry]} or a packed clamp blob
// (ClampHookPacked), or the fork's wire map {"hooks": {hook: table}}.
type tierClamps map[string]json.RawMessage

// setRequest is the body of POST /v1/steering/set (and of `steer global set --file`).
type setRequest struct {
	Vectors           tierVectors        `json:"vectors,omitempty"`
	PrefillVectors    tierVectors        `json:"prefill_vectors,omitempty"`
	DecodeVectors     tierVectors        `json:"decode_vectors,omitempty"`
	Clamps            tierClamps         `json:"clamps,omitempty"`
	PrefillClamps     tierClamps         `json:"prefill_clamps,omitempty"`
	DecodeClamps      tierClamps         `json:"decode_clamps,omitempty"`
	VectorRefs        map[string]float32 `json:"vector_refs,omitempty"`
	PrefillVectorRefs map[string]float32 `json:"prefill_vector_refs,omitempty"`
	DecodeVectorRefs  map[string]float32 `json:"decode_vector_refs,omitempty"`
	Replace           bool               `json:"replace,omitempty"`

	// split is the fast reader's split of the vector tiers' hook objects into their fields,
	// by the address of the object's first byte in the body (nil from encoding/json).
	split map[*byte]map[string]json.RawMessage
}

// decodeStrict decodes one JSON value, refusing unknown fields and trailing data; the error
// says what is wrong in the client's terms.
func decodeStrict(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return badInput("malformed request body: %s", describeJSONError(err))
	}
	if d.More() {
		return badInput("malformed request body: trailing data after the JSON body")
	}
	return nil
}

// tierSpec is one tier of a request body with its field names (the fork's, for messages).
type tierSpec struct {
	phase     steer.Phase
	vecs      tierVectors
	cl        tierClamps
	refs      map[string]float32
	vecField  string
	clampName string
}

func (r *setRequest) tiers() []tierSpec {
	return []tierSpec{
		{steer.PhaseBase, r.Vectors, r.Clamps, r.VectorRefs, "vectors", "clamps"},
		{steer.PhasePrefill, r.PrefillVectors, r.PrefillClamps, r.PrefillVectorRefs, "prefill_vectors", "prefill_clamps"},
		{steer.PhaseDecode, r.DecodeVectors, r.DecodeClamps, r.DecodeVectorRefs, "decode_vectors", "decode_clamps"},
	}
}

// Steering converts the request to steering tiers. It checks the structure only (the fork's
// "Malformed steering payload" errors); CheckSites checks hooks, layers and widths against the
// model, and steer validates the rest.
func (r *setRequest) Steering(cfg steer.ModelConfig) (steer.Steering, error) {
	var s steer.Steering
	for _, t := range r.tiers() {
		tier := s.Tier(t.phase)
		vs, err := parseVectorSpec(t.vecs, t.vecField, r.split)
		if err != nil {
			return s, err
		}
		tier.Vectors = vs
		cs, err := parseClampSpec(t.cl, t.clampName)
		if err != nil {
			return s, err
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

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// parseLayerKey reads a JSON layer key: a non-negative integer.
func parseLayerKey(field, hook, k string) (int, error) {
	n, err := strconv.Atoi(k)
	if err != nil || n < 0 {
		return 0, malformed("", "Steering tier %s has invalid layer index %s in %s; expected a non-negative integer", pyStr(hook), pyStr(k), field)
	}
	return n, nil
}

// isPacked reports whether a hook's value is a packed blob (it has "data" and "dtype", as
// the fork's _looks_packed decides), and for clamps also "bounds".
func isPacked(fields map[string]json.RawMessage, clamp bool) bool {
	_, d := fields["data"]
	_, t := fields["dtype"]
	_, b := fields["bounds"]
	return d && t && (!clamp || b)
}

// parseVectorSpec reads one tier; vectors come out sorted by hook then layer. split (nil or
// setRequest.split) has hook objects the fast reader split already: they are not read again.
func parseVectorSpec(spec tierVectors, field string, split map[*byte]map[string]json.RawMessage) ([]steer.Vector, error) {
	var out []steer.Vector
	for _, hook := range sortedKeys(spec) {
		raw := spec[hook]
		var fields map[string]json.RawMessage
		ok := false
		if len(raw) > 0 {
			fields, ok = split[&raw[0]]
		}
		if !ok {
			fields, ok = rawObject(raw)
		}
		if !ok && (json.Unmarshal(raw, &fields) != nil || fields == nil) {
			return nil, malformed("", "Steering tier %s in %s must map layer indices to entries, got %s", pyStr(hook), field, jsonKind(raw))
		}
		if isPacked(fields, false) {
			p, err := packedFrom(fields, fmt.Sprintf("%s[%s]", field, pyStr(hook)))
			if err != nil {
				return nil, err
			}
			vs, err := p.vectors(hook)
			if err != nil {
				return nil, fmt.Errorf("%s[%s]: %w", field, pyStr(hook), err)
			}
			out = append(out, vs...)
			continue
		}
		layers := make([]int, 0, len(fields))
		byLayer := map[int]json.RawMessage{}
		for _, k := range sortedKeys(fields) { // the first bad key in a fixed order
			v := fields[k]
			l, err := parseLayerKey(field, hook, k)
			if err != nil {
				return nil, err
			}
			if _, dup := byLayer[l]; dup {
				return nil, malformed("", "Steering tier %s in %s gives layer %d twice", pyStr(hook), field, l)
			}
			byLayer[l] = v
			layers = append(layers, l)
		}
		slices.Sort(layers)
		for _, l := range layers {
			v, err := parseEntry(byLayer[l], fmt.Sprintf("%s[%s][%d]", field, pyStr(hook), l))
			if err != nil {
				return nil, err
			}
			v.Hook, v.Layer = hook, l
			out = append(out, v)
		}
	}
	return out, nil
}

// packedBlob is a packed blob read from a body: data is its base64 when taken straight from
// between its quotes (no escape: base64 needs none), and Packed.Data is then set only if vecfile
// must decode it. That saves copying, or decoding, a multi-megabyte string.
type packedBlob struct {
	vecfile.Packed
	data []byte
}

// packedFrom builds a packed blob from an object already split into fields, refusing unknown
// ones.
func packedFrom(fields map[string]json.RawMessage, path string) (packedBlob, error) {
	var p packedBlob
	for _, k := range sortedKeys(fields) { // the first bad field in a fixed order
		v := fields[k]
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
				p.data = v[1 : len(v)-1 : len(v)-1]
				continue
			}
			dst = &p.Data
		default:
			return p, malformed(path, "SteeringHookPacked has unexpected key %s; allowed keys: ['data', 'dtype', 'layer_indices', 'scales', 'shape']", pyStr(k))
		}
		if err := json.Unmarshal(v, dst); err != nil {
			return p, malformed(path, "SteeringHookPacked.%s: %s", k, describeJSONError(err))
		}
	}
	return p, nil
}

// vectors is packedVectors of the blob.
func (p *packedBlob) vectors(hook string) ([]steer.Vector, error) {
	if p.data != nil {
		if vs, ok := fastPackedVectors(&p.Packed, p.data, hook); ok {
			return vs, nil
		}
		p.Data, p.data = string(p.data), nil
	}
	return packedVectors(&p.Packed, hook)
}

// parseFloats reads a JSON array of numbers, with the fork's messages for anything else.
func parseFloats(raw json.RawMessage, path string) ([]float32, error) {
	if d, ok := fastFloats(raw); ok {
		return d, nil
	}
	var d []float32
	if err := json.Unmarshal(raw, &d); err == nil {
		return d, nil
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, malformed(path, "must be a list of floats, got %s", jsonKind(raw))
	}
	d = make([]float32, len(elems))
	for i, e := range elems {
		if jsonKind(e) != "float" {
			return nil, malformed(path, "[%d] must be a finite float, got %s", i, jsonKind(e))
		}
		f, err := strconv.ParseFloat(string(bytes.TrimSpace(e)), 64)
		if err != nil || math.IsInf(float64(float32(f)), 0) {
			return nil, malformedAs(steer.ErrNonFinite, path, "[%d] must be finite, got %s (beyond float32)", i, bytes.TrimSpace(e))
		}
		d[i] = float32(f)
	}
	return d, nil
}

// parseEntry reads [floats] or {"vector": [floats], "scale": s} (both keys required, as the
// fork's normalize_layer_entry has them).
func parseEntry(raw json.RawMessage, path string) (steer.Vector, error) {
	switch jsonKind(raw) {
	case "list":
		d, err := parseFloats(raw, path)
		return steer.Vector{Scale: 1, Data: d}, err
	case "dict":
	default:
		return steer.Vector{}, malformed(path, "SteeringLayerEntry must be a list or dict, got %s", jsonKind(raw))
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return steer.Vector{}, malformed(path, "%s", describeJSONError(err))
	}
	var extra []string
	for k := range fields {
		if k != "vector" && k != "scale" {
			extra = append(extra, k)
		}
	}
	if len(extra) > 0 {
		sort.Strings(extra)
		return steer.Vector{}, malformed(path, "Scaled steering entry has unexpected keys: %s; allowed keys: ['scale', 'vector']", pyList(extra))
	}
	var missing []string
	for _, k := range []string{"scale", "vector"} {
		if _, ok := fields[k]; !ok {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		return steer.Vector{}, malformed(path, "Scaled steering entry missing required key(s): %s; got keys: %s", pyList(missing), pyList(sortedKeys(fields)))
	}
	d, err := parseFloats(fields["vector"], path+"['vector']")
	if err != nil {
		return steer.Vector{}, err
	}
	if jsonKind(fields["scale"]) != "float" {
		return steer.Vector{}, malformed(path, "['scale'] must be a finite float, got %s.", jsonKind(fields["scale"]))
	}
	sc, err := strconv.ParseFloat(string(bytes.TrimSpace(fields["scale"])), 64)
	if err != nil || math.IsInf(float64(float32(sc)), 0) {
		// beyond float32: ±Inf, refused as non-finite
		return steer.Vector{}, malformedAs(steer.ErrNonFinite, path, "['scale'] must be finite, got %s.", bytes.TrimSpace(fields["scale"]))
	}
	return steer.Vector{Scale: float32(sc), Data: d}, nil
}

// openBound is the largest float32 not above steer.MaxMagnitude (float32(1e30) rounds up).
var openBound = math.Nextafter32(float32(steer.MaxMagnitude), 0)

// decodeRows decodes base64 little-endian rows of shape [n, width] in dtype to float32
// (values beyond float32 become ±Inf, refused later as non-finite). what names the blob type
// in messages (the fork's: SteeringHookPacked, ClampHookPacked).
func decodeRows(dtype string, shape []int, data, path, what string) ([][]float32, error) {
	rows, err := vecfile.DecodePackedRows(dtype, shape, data, what)
	return rows, packedError(path, err)
}

// packedError words a malformed packed blob as the fork's routers do.
func packedError(path string, err error) error {
	var pe *vecfile.PackedError
	if errors.As(err, &pe) {
		return malformed(path, "%s", pe.Msg)
	}
	return err
}

// packedVectors is p.Vectors(hook) with the fork's wording of its errors.
func packedVectors(p *vecfile.Packed, hook string) ([]steer.Vector, error) {
	if vs, ok := fastPackedVectors(p, p.Data, hook); ok {
		return vs, nil
	}
	vs, err := p.Vectors(hook)
	return vs, packedError("", err)
}

// packVectors encodes vectors of one hook as a float32 packed blob (for clients and tests).
func packVectors(vs []steer.Vector) vecfile.Packed {
	p := vecfile.Packed{Dtype: "float32", Shape: []int{len(vs), 0}}
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

// siteStyle words CheckSites' errors for one endpoint, as the fork's router or registry does.
type siteStyle int

const (
	styleSet    siteStyle = iota // /v1/steering/set (the fork's worker validation texts)
	styleModule                  // modules/register (the fork's SteeringModuleRegistry texts)
	styleVector                  // vectors/register (the fork's SteeringVectorRegistry texts)
)

// CheckSites checks st's hooks, layers and widths against the model with the fork's messages
// (wrapping steer's sentinels, so the reply's type is unknown_hook, layer_range or
// hidden_size). name is the module's or vector's name (styleModule, styleVector).
func checkSites(st *steer.Steering, cfg steer.ModelConfig, style siteStyle, name string) error {
	valid := make([]string, cfg.NumHooks())
	for i := range valid {
		valid[i] = cfg.HookName(steer.HookID(i))
	}
	sort.Strings(valid)
	var bad []string
	var missing []int
	matched := map[int]bool{}
	type tierNames struct{ vec, clamp string }
	names := map[steer.Phase]tierNames{steer.PhaseBase: {"vectors", "clamps"}, steer.PhasePrefill: {"prefill_vectors", "prefill_clamps"}, steer.PhaseDecode: {"decode_vectors", "decode_clamps"}}
	var widthErr error
	layer := func(l int) {
		if l < cfg.Layers {
			matched[l] = true
		} else if !slices.Contains(missing, l) {
			missing = append(missing, l)
		}
	}
	for _, ph := range []steer.Phase{steer.PhaseBase, steer.PhasePrefill, steer.PhaseDecode} {
		t := st.Tier(ph)
		for _, v := range t.Vectors {
			if !slices.Contains(valid, v.Hook) {
				bad = append(bad, v.Hook)
				continue
			}
			layer(v.Layer)
			if widthErr != nil || len(v.Data) == cfg.Hidden || v.Layer >= cfg.Layers {
				continue
			}
			switch style {
			case styleSet:
				widthErr = fmt.Errorf("%w: Layer %d (%s): expected vector of size %d, got %d", steer.ErrHiddenSize, v.Layer, v.Hook, cfg.Hidden, len(v.Data))
			case styleModule:
				widthErr = fmt.Errorf("%w: module %s %s[%s][%d]: vector width %d != expected steering row width %d (model hidden size)", steer.ErrHiddenSize, pyStr(name), names[ph].vec, pyStr(v.Hook), v.Layer, len(v.Data), cfg.Hidden)
			default:
				widthErr = fmt.Errorf("%w: vector %s [%s][%d]: vector width %d != expected steering row width %d (model hidden size)", steer.ErrHiddenSize, pyStr(name), pyStr(v.Hook), v.Layer, len(v.Data), cfg.Hidden)
			}
		}
		for _, c := range t.Clamps {
			if !slices.Contains(valid, c.Hook) {
				bad = append(bad, c.Hook)
				continue
			}
			layer(c.Layer)
			if widthErr != nil || len(c.Dir) == cfg.Hidden || c.Layer >= cfg.Layers {
				continue
			}
			if style == styleSet {
				widthErr = fmt.Errorf("%w: Layer %d (%s): expected clamp directions of size %d, got %d", steer.ErrHiddenSize, c.Layer, c.Hook, cfg.Hidden, len(c.Dir))
			} else {
				widthErr = fmt.Errorf("%w: module %s %s[%s]: clamp direction width %d does not match the model hidden size (%d)", steer.ErrHiddenSize, pyStr(name), names[ph].clamp, pyStr(c.Hook), len(c.Dir), cfg.Hidden)
			}
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		bad = slices.Compact(bad)
		switch style {
		case styleSet:
			return fmt.Errorf("%w: Invalid hook point name(s): %s. Valid values: %s", steer.ErrUnknownHook, pyList(bad), pyList(valid))
		case styleModule:
			return fmt.Errorf("%w: Invalid hook point name(s) in module %s: %s. Valid: %s", steer.ErrUnknownHook, pyStr(name), pyList(bad), pyList(valid))
		default:
			return fmt.Errorf("%w: vector %s has invalid hook(s) %s; valid: %s", steer.ErrUnknownHook, pyStr(name), pyList(bad), pyList(valid))
		}
	}
	if widthErr != nil {
		return widthErr
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		all := make([]int, cfg.Layers)
		for i := range all {
			all[i] = i
		}
		switch style {
		case styleSet:
			var ok []int
			for l := range matched {
				ok = append(ok, l)
			}
			slices.Sort(ok)
			got := "none"
			if len(ok) > 0 {
				got = intList(ok)
			}
			return fmt.Errorf("%w: Layer(s) %s not found in model. Steerable layers that matched: %s", steer.ErrLayerRange, intList(missing), got)
		case styleModule:
			return fmt.Errorf("%w: Steering module %s references unknown layer index %d. Valid steerable layers: %s", steer.ErrLayerRange, pyStr(name), missing[0], intList(all))
		default:
			return fmt.Errorf("%w: vector %s references layer %d which is not a valid model layer (valid: %s)", steer.ErrLayerRange, pyStr(name), missing[0], intList(all))
		}
	}
	return nil
}
