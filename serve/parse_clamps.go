package serve

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"

	"github.com/shmsteer/shmsteer/steer"
)

// parseClampSpec reads one clamp tier: entry lists, packed blobs (ClampHookPacked) or the
// fork's wire map {"hooks": {hook: {shape, layer_indices, data, lo, hi, strength}}}.
func parseClampSpec(spec tierClamps, field string) ([]steer.Clamp, error) {
	if raw, ok := spec["hooks"]; ok && len(spec) == 1 {
		return parseClampWireMap(raw, field)
	}
	var out []steer.Clamp
	for _, hook := range sortedKeys(spec) {
		raw := spec[hook]
		path := fmt.Sprintf("%s[%s]", field, pyStr(hook))
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
			return nil, malformed("", "%s must map layer indices to entry lists, got %s", path, jsonKind(raw))
		}
		if isPacked(fields, true) {
			cs, err := parsePackedClamps(hook, fields, field)
			if err != nil {
				return nil, err
			}
			out = append(out, cs...)
			continue
		}
		var layers []int
		byLayer := map[int]json.RawMessage{}
		for _, k := range sortedKeys(fields) { // the first bad key in a fixed order
			v := fields[k]
			l, err := strconv.Atoi(k)
			if err != nil || l < 0 {
				return nil, malformed("", "%s has invalid layer index %s; expected a non-negative integer", path, pyStr(k))
			}
			byLayer[l] = v
			layers = append(layers, l)
		}
		slices.Sort(layers)
		width := -1
		for _, l := range layers {
			lpath := fmt.Sprintf("%s[%d]", path, l)
			raw := byLayer[l]
			var entries []json.RawMessage
			switch jsonKind(raw) {
			case "list":
				if err := json.Unmarshal(raw, &entries); err != nil {
					return nil, malformed(lpath, "%s", describeJSONError(err))
				}
			case "dict":
				entries = []json.RawMessage{raw} // one entry without its list: taken as a list of one
			default:
				return nil, malformed("", "%s must be a list of clamp entries, got %s", lpath, jsonKind(raw))
			}
			for _, e := range entries {
				c, err := parseClamp(e, lpath)
				if err != nil {
					return nil, err
				}
				if width >= 0 && len(c.Dir) != width {
					return nil, malformed(lpath, "direction width %d != %d of earlier entries in the same hook", len(c.Dir), width)
				}
				width = len(c.Dir)
				c.Hook, c.Layer = hook, l
				out = append(out, c)
			}
		}
	}
	return out, nil
}

// parseClamp reads {vector, min?, max?, strength?} or {vector, value, strength?}, with the
// fork's checks and messages. An open bound is ±openBound, just below steer.MaxMagnitude (no
// projection reaches it); strength defaults to 1 and must be in [0, 1].
func parseClamp(raw json.RawMessage, path string) (steer.Clamp, error) {
	if jsonKind(raw) != "dict" {
		return steer.Clamp{}, malformed(path, "Clamp entry must be a dict, got %s", jsonKind(raw))
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return steer.Clamp{}, malformed(path, "%s", describeJSONError(err))
	}
	var extra []string
	for k := range fields {
		if !slices.Contains([]string{"vector", "value", "min", "max", "strength"}, k) {
			extra = append(extra, k)
		}
	}
	if len(extra) > 0 {
		sort.Strings(extra)
		return steer.Clamp{}, malformed(path, "Clamp entry has unexpected keys: %s; allowed keys: ['max', 'min', 'strength', 'value', 'vector']", pyList(extra))
	}
	vraw, ok := fields["vector"]
	if !ok {
		return steer.Clamp{}, malformed(path, "Clamp entry missing required key 'vector'")
	}
	num := func(k string) (*float64, error) {
		r, ok := fields[k]
		if !ok || jsonKind(r) == "NoneType" {
			return nil, nil
		}
		if jsonKind(r) != "float" {
			return nil, malformed(path, "Clamp entry %s must be a number, got %s", pyStr(k), jsonKind(r))
		}
		f, err := strconv.ParseFloat(string(bytes.TrimSpace(r)), 64)
		if err != nil || math.IsInf(float64(float32(f)), 0) {
			return nil, malformedAs(steer.ErrNonFinite, path, "Clamp entry %s must be finite, got %s", pyStr(k), bytes.TrimSpace(r))
		}
		return &f, nil
	}
	var vals [4]*float64
	for i, k := range []string{"value", "min", "max", "strength"} {
		f, err := num(k)
		if err != nil {
			return steer.Clamp{}, err
		}
		vals[i] = f
	}
	value, lo, hi, strength := vals[0], vals[1], vals[2], vals[3]
	c := steer.Clamp{Min: -openBound, Max: openBound, Strength: 1}
	switch {
	case value != nil && (lo != nil || hi != nil):
		return c, malformedAs(steer.ErrBadClamp, path, "Clamp entry 'value' is mutually exclusive with 'min'/'max'")
	case value != nil:
		c.Min, c.Max = float32(*value), float32(*value)
	case lo == nil && hi == nil:
		return c, malformedAs(steer.ErrBadClamp, path, "Clamp entry must set at least one of 'value', 'min', 'max'")
	}
	if lo != nil {
		c.Min = float32(*lo)
	}
	if hi != nil {
		c.Max = float32(*hi)
	}
	if c.Min > c.Max {
		return c, malformedAs(steer.ErrBadClamp, path, "Clamp entry min (%g) must be <= max (%g)", c.Min, c.Max)
	}
	if strength != nil {
		c.Strength = float32(*strength)
	}
	if !(c.Strength >= 0 && c.Strength <= 1) {
		return c, malformedAs(steer.ErrBadClamp, path, "Clamp entry strength must be in [0, 1], got %g", c.Strength)
	}
	if jsonKind(vraw) != "list" {
		return c, malformed(path, "Clamp entry vector must be a non-empty 1-D float list, got %s", jsonKind(vraw))
	}
	d, err := parseFloats(vraw, path+"['vector']")
	if err != nil {
		return c, err
	}
	if len(d) == 0 {
		return c, malformedAs(steer.ErrBadClamp, path, "Clamp entry vector must be a non-empty 1-D float list, got shape (0,)")
	}
	c.Dir = d
	return c, checkClampDir(d, path)
}

// checkClampDir refuses a zero direction with the fork's words.
func checkClampDir(d []float32, path string) error {
	for _, f := range d {
		if f != 0 {
			return nil
		}
	}
	return malformedAs(steer.ErrBadClamp, path, "Clamp entry vector must be non-zero (a zero vector cannot be normalized to a direction)")
}

// parsePackedClamps reads a ClampHookPacked blob: {dtype, shape [n, hidden], layer_indices,
// data, bounds [[lo|null, hi|null]], strengths}; rows may share a layer (order kept).
func parsePackedClamps(hook string, fields map[string]json.RawMessage, field string) ([]steer.Clamp, error) {
	path := fmt.Sprintf("%s: ClampHookPacked[%s]", field, pyStr(hook))
	var p struct {
		Dtype        string          `json:"dtype"`
		Shape        []int           `json:"shape"`
		LayerIndices []int           `json:"layer_indices"`
		Data         string          `json:"data"`
		Bounds       [][]*float64    `json:"bounds"`
		Strengths    []float64       `json:"strengths"`
		Scales       json.RawMessage `json:"scales"`
	}
	raw, _ := json.Marshal(fields)
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	if err := d.Decode(&p); err != nil {
		return nil, malformed("", "%s: %s", path, describeJSONError(err))
	}
	if p.Scales != nil {
		return nil, malformed("", "%s: a packed clamp takes bounds and strengths, not scales", path)
	}
	rows, err := decodeRows(p.Dtype, p.Shape, p.Data, path, "ClampHookPacked")
	if err != nil {
		return nil, err
	}
	n := len(rows)
	for name, l := range map[string]int{"layer_indices": len(p.LayerIndices), "bounds": len(p.Bounds), "strengths": len(p.Strengths)} {
		if l != n {
			return nil, malformed("", "%s.%s length (%d) must equal shape[0] (%d)", path, name, l, n)
		}
	}
	out := make([]steer.Clamp, n)
	for i := range rows {
		if len(p.Bounds[i]) != 2 {
			return nil, malformed("", "%s.bounds[%d] must be a [lo, hi] pair", path, i)
		}
		c := steer.Clamp{Hook: hook, Layer: p.LayerIndices[i], Dir: rows[i], Min: -openBound, Max: openBound, Strength: float32(p.Strengths[i])}
		if c.Layer < 0 {
			return nil, malformed("", "%s.layer_indices entries must be non-negative ints; got %d", path, c.Layer)
		}
		if b := p.Bounds[i][0]; b != nil {
			c.Min = float32(*b)
		}
		if b := p.Bounds[i][1]; b != nil {
			c.Max = float32(*b)
		}
		if math.IsInf(float64(c.Min), 0) || math.IsInf(float64(c.Max), 0) {
			return nil, malformedAs(steer.ErrNonFinite, "", "%s.bounds[%d]: present bounds must be finite (null is an open bound)", path, i)
		}
		if c.Min > c.Max {
			return nil, malformedAs(steer.ErrBadClamp, "", "%s: Clamp entry min (%g) must be <= max (%g)", path, c.Min, c.Max)
		}
		if !(c.Strength >= 0 && c.Strength <= 1) {
			return nil, malformedAs(steer.ErrBadClamp, "", "%s: Clamp entry strength must be in [0, 1], got %g", path, c.Strength)
		}
		if !allFinite(c.Dir) {
			return nil, malformedAs(steer.ErrNonFinite, "", "%s: clamp direction rows must contain only finite floats", field+"["+pyStr(hook)+"]")
		}
		if err := checkClampDir(c.Dir, field+"["+pyStr(hook)+"]"); err != nil {
			return nil, err
		}
		out[i] = c
	}
	return out, nil
}

// parseClampWireMap reads the fork's canonical clamp form {"hooks": {hook: {shape,
// layer_indices, data (base64 float64 rows), lo, hi, strength}}} (null bounds are open).
func parseClampWireMap(raw json.RawMessage, field string) ([]steer.Clamp, error) {
	var hooks map[string]struct {
		Shape        []int      `json:"shape"`
		LayerIndices []int      `json:"layer_indices"`
		Data         string     `json:"data"`
		Lo           []*float64 `json:"lo"`
		Hi           []*float64 `json:"hi"`
		Strength     []float64  `json:"strength"`
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	if err := d.Decode(&hooks); err != nil {
		return nil, malformed(field+".hooks", "%s", describeJSONError(err))
	}
	var out []steer.Clamp
	for _, hook := range sortedKeys(hooks) {
		t := hooks[hook]
		path := fmt.Sprintf("%s[%s]", field, pyStr(hook))
		rows, err := decodeRows("float64", t.Shape, t.Data, path, "ClampHookTable")
		if err != nil {
			return nil, err
		}
		n := len(rows)
		if len(t.LayerIndices) != n || len(t.Lo) != n || len(t.Hi) != n || len(t.Strength) != n {
			return nil, malformed(path, "ClampHookTable layer_indices, lo, hi and strength must each have shape[0] (%d) entries", n)
		}
		for i := range rows {
			c := steer.Clamp{Hook: hook, Layer: t.LayerIndices[i], Dir: rows[i], Min: -openBound, Max: openBound, Strength: float32(t.Strength[i])}
			if t.Lo[i] != nil {
				c.Min = float32(*t.Lo[i])
			}
			if t.Hi[i] != nil {
				c.Max = float32(*t.Hi[i])
			}
			if c.Layer < 0 || c.Min > c.Max || !(c.Strength >= 0 && c.Strength <= 1) {
				return nil, malformedAs(steer.ErrBadClamp, path, "row %d: layer %d, bounds [%g, %g], strength %g: want a layer >= 0, min <= max and strength in [0, 1]", i, c.Layer, c.Min, c.Max, c.Strength)
			}
			if err := checkClampDir(c.Dir, path); err != nil {
				return nil, err
			}
			out = append(out, c)
		}
	}
	return out, nil
}

func allFinite(d []float32) bool {
	for _, f := range d {
		if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
			return false
		}
	}
	return true
}
